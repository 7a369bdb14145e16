"""Render every page of the built docs site in headless Chromium and check what a reader sees.

Usage::

    .venv/bin/mkdocs build --strict --site-dir site
    .venv/bin/python tools/docs_check.py site --screenshots shots/ [--width 1280] [--jobs 2]

For each HTML page of the built site (served from a local HTTP server, as a reader's browser would load it) the
script

1. loads the page in ``chromium --headless`` at ``--width`` px, waits for MathJax to typeset (``--virtual-time-budget``)
   and reads the DOM (``--dump-dom``) after a probe script injected into a copy of the page has measured it:

   * **raw TeX**: visible text (outside code, scripts and typeset maths) still containing ``\\(``, ``\\)``, ``\\[``,
     ``\\]`` or ``$$``, or a MathJax error box (``mjx-merror``: TeX that MathJax could not parse);
   * **raw rST**: visible text still containing a Sphinx role (``:func:`...```, ``:math:`...```) or ``.. math::``;
   * **clipped**: an element of the content column whose ``scrollWidth`` exceeds its ``clientWidth`` while no element
     from it up to the column scrolls horizontally (``overflow-x: auto|scroll``): its content is cut off or spills
     over the page; and a page that scrolls sideways as a whole;
   * **external**: a script, stylesheet or font loaded from another host;

2. saves a full-page PNG screenshot (``--screenshots``; height capped at ``--max-height`` px).

Prints one line per problem and a summary; exits 1 when any page has a problem.  Needs the Debian package
``chromium`` (``apt-get install -y chromium``; ``--chromium`` for another binary).  Runs as root with
``--no-sandbox``.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import html
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PROBE_ID = "docs-check-result"

# Runs in the page: waits for MathJax, then measures the DOM and writes a JSON report into <pre id=PROBE_ID>.
PROBE_JS = r"""
(function () {
  const SKIP = "code, pre, script, style, textarea, mjx-container, mjx-assistive-mml, .md-search, nav, #__PROBE__";
  const RAW_TEX = /\\\(|\\\)|\\\[|\\\]|\$\$/;
  const TOLERANCE = 4;  // px: sub-glyph overflows (rounding, a heading's permalink) are not reported
  // a raw role: ":func:`x`" in one text node, or ":func:" ending one before the <code> Markdown made of its body
  const RAW_RST = /:(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|math|ref):(?:`|\s*$)|\.\. math::/;
  function snippet(text, re) {
    const i = text.search(re);
    return text.slice(Math.max(0, i - 40), i + 60).replace(/\s+/g, " ");
  }
  function where(el) {
    const parts = [];
    for (let e = el; e && e.tagName && parts.length < 4; e = e.parentElement) {
      let s = e.tagName.toLowerCase();
      if (e.id) { s += "#" + e.id; parts.unshift(s); break; }
      if (e.classList.length) s += "." + [...e.classList].slice(0, 2).join(".");
      parts.unshift(s);
    }
    const h = el.closest("[id]");
    return parts.join(" > ") + (h ? "  (in #" + h.id + ")" : "");
  }
  function scrolls(el) {
    const o = getComputedStyle(el).overflowX;
    return o === "auto" || o === "scroll";
  }
  function measure() {
    const out = {raw_tex: [], raw_rst: [], clipped: [], merror: 0, blank_glyphs: 0, page_scroll: 0, height: 0};
    const column = document.querySelector("article") || document.body;
    const walker = document.createTreeWalker(column, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const parent = node.parentElement;
      if (!parent || parent.closest(SKIP)) continue;
      const text = node.textContent;
      if (RAW_TEX.test(text)) out.raw_tex.push(snippet(text, RAW_TEX));
      if (RAW_RST.test(text)) out.raw_rst.push(snippet(text, RAW_RST));
    }
    out.merror = column.querySelectorAll("mjx-merror").length;
    // typeset but unpainted maths: a glyph whose CSS rule is missing has no ::before content and no width
    const glyphs = [...column.querySelectorAll("mjx-container mjx-c")].slice(0, 3000);
    out.blank_glyphs = glyphs.filter((c) => getComputedStyle(c, "::before").content === "none").length;
    // An element is a problem when its content is cut off (overflow-x hidden/clip) or spills past the right edge
    // of the content column (overflow-x visible), unless it or an ancestor inside the column scrolls sideways.
    const right = column.parentElement.getBoundingClientRect().right;  // .md-content: the column with its margins
    const offenders = [];
    for (const el of column.querySelectorAll("*")) {
      if (el.clientWidth === 0 || el.scrollWidth <= el.clientWidth + TOLERANCE) continue;
      if (getComputedStyle(el).display.startsWith("inline") || el.closest("mjx-container:not([display])")) continue;
      let contained = false;
      for (let e = el; e && e !== column.parentElement; e = e.parentElement) {
        if (scrolls(e)) { contained = true; break; }
      }
      if (contained) continue;
      const o = getComputedStyle(el).overflowX;
      const box = el.getBoundingClientRect();
      const spill = box.left + el.clientLeft + el.scrollWidth - right;
      if (o === "hidden" || o === "clip" || spill > TOLERANCE) offenders.push([el, o === "visible" ? spill : 0]);
    }
    // report the innermost offenders (the too-wide content), not every ancestor that inherits the overflow
    for (const [el, spill] of offenders) {
      if (offenders.some(([other]) => other !== el && el.contains(other))) continue;
      const y = Math.round(el.getBoundingClientRect().top + window.scrollY);
      out.clipped.push(where(el) + " at y=" + y + ": " + (spill ? "spills " + Math.round(spill) + " px past the column"
        : "cut off (scrollWidth " + el.scrollWidth + " > clientWidth " + el.clientWidth + ")")
        + "  [" + (el.textContent || "").trim().slice(0, 60).replace(/\s+/g, " ") + "]");
    }
    const root = document.scrollingElement;
    out.page_scroll = Math.max(0, root.scrollWidth - root.clientWidth);
    out.height = Math.ceil(root.scrollHeight);
    const pre = document.createElement("pre");
    pre.id = "__PROBE__";
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  function run() {
    const mj = window.MathJax;
    const ready = mj && mj.startup && mj.startup.promise ? mj.startup.promise : Promise.resolve();
    // headless Chromium paints before it fetches the fonts MathJax's CSS declares: load them all first
    const fonts = () => Promise.all([...document.fonts].map((f) => f.load().catch(() => null)));
    ready.then(fonts).then(() => document.fonts.ready).then(() => setTimeout(measure, 300));
  }
  if (document.readyState === "complete") run(); else window.addEventListener("load", run);
})();
""".replace("__PROBE__", PROBE_ID)

_RESULT_RE = re.compile(rf'<pre id="{PROBE_ID}">(.*?)</pre>', re.DOTALL)


@dataclass
class PageReport:
    """What the probe found on one page."""

    page: str
    raw_tex: list[str] = field(default_factory=list)
    raw_rst: list[str] = field(default_factory=list)
    clipped: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    merror: int = 0
    blank_glyphs: int = 0
    page_scroll: int = 0
    height: int = 0
    error: str = ""

    def problems(self) -> list[str]:
        found = [f"raw TeX: {s!r}" for s in self.raw_tex] + [f"raw rST: {s!r}" for s in self.raw_rst]
        found += [f"clipped: {s}" for s in self.clipped] + [f"external: {s}" for s in self.external]
        if self.merror:
            found.append(f"MathJax errors (TeX it could not parse): {self.merror}")
        if self.blank_glyphs:
            found.append(f"maths typeset but not painted: {self.blank_glyphs} glyphs without their CSS")
        if self.page_scroll:
            found.append(f"the page scrolls sideways by {self.page_scroll} px")
        if self.error:
            found.append(f"not checked: {self.error}")
        return found


_EXTERNAL_RE = re.compile(
    r"<(?:script|link|img|iframe)\b[^>]*?\b(?:src|href)=\"((?:https?:)?//[^\"]+)\"[^>]*>", re.IGNORECASE
)


def external_assets(page_html: str) -> list[str]:
    """Scripts, stylesheets, fonts, images and frames a page loads from another host (plain links excluded)."""
    found = []
    for match in _EXTERNAL_RE.finditer(page_html):
        tag = match[0]
        if tag.lower().startswith("<link") and not re.search(r'rel="(?:stylesheet|preload|preconnect|icon)', tag):
            continue
        found.append(html.unescape(match[1]))
    return found


def _chromium(binary: str, width: int, height: int, budget_ms: int, *extra: str) -> list[str]:
    """A headless Chromium command with its own empty profile and no background traffic (this machine's network
    is closed; the check loads only the local server)."""
    profile = tempfile.mkdtemp(prefix="docs-check-profile-")
    return [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--disable-extensions", "--mute-audio", "--disable-quic", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
            f"--window-size={width},{height}", f"--virtual-time-budget={budget_ms}", *extra]


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one Chromium command, then delete the profile folder it was given."""
    profile = next(a.split("=", 1)[1] for a in cmd if a.startswith("--user-data-dir="))
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def check_page(url: str, page: str, args: argparse.Namespace) -> PageReport:
    """Load ``url`` in headless Chromium, read the probe's report and save the screenshot."""
    report = PageReport(page)
    cmd = _chromium(args.chromium, args.width, 900, args.budget_ms, "--dump-dom", url)
    try:
        done = _run(cmd, args.timeout)
    except subprocess.TimeoutExpired:
        report.error = f"chromium --dump-dom took over {args.timeout} s"
        return report
    found = _RESULT_RE.search(done.stdout)
    if found is None:
        report.error = f"no probe result (chromium exit {done.returncode}: {done.stderr.strip()[-300:]})"
        return report
    data = json.loads(html.unescape(found[1]))
    for key in ("raw_tex", "raw_rst", "clipped", "merror", "blank_glyphs", "page_scroll", "height"):
        setattr(report, key, data[key])
    if args.screenshots is not None:
        png = args.screenshots / (page.removesuffix("index.html").strip("/").replace("/", "__") or "index")
        height = max(600, min(report.height, args.max_height))
        shot = _chromium(args.chromium, args.width, height, args.budget_ms, f"--screenshot={png}.png", url)
        try:
            _run(shot, args.timeout)
        except subprocess.TimeoutExpired:
            report.error = f"chromium --screenshot took over {args.timeout} s"
    return report


def _serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def pages_of(site: Path) -> list[str]:
    """The site's HTML pages (relative paths), the 404 page and MkDocs' sitemap/search files excluded."""
    return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                  if p.name != "404.html" and "assets" not in p.relative_to(site).parts)


def check_site(site: Path, args: argparse.Namespace) -> list[PageReport]:
    """Copy the site, inject the probe into every page, serve it, and check the pages in parallel."""
    with tempfile.TemporaryDirectory(prefix="docs-check-") as tmp:
        copy = Path(tmp) / "site"
        shutil.copytree(site, copy)
        pages = [p for p in pages_of(copy) if args.only is None or any(fnmatch.fnmatch(p, g) for g in args.only)]
        externals = {}
        for page in pages:
            path = copy / page
            text = path.read_text(encoding="utf-8")
            externals[page] = external_assets(text)
            path.write_text(text.replace("</body>", f"<script>{PROBE_JS}</script></body>"), encoding="utf-8")
        server, base = _serve(copy)
        try:
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                reports = list(pool.map(lambda p: check_page(base + p, p, args), pages))
        finally:
            server.shutdown()
    for report in reports:
        report.external = externals[report.page]
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build --site-dir)")
    parser.add_argument("--screenshots", type=Path, default=None, help="folder for one PNG per page")
    parser.add_argument("--width", type=int, default=1280, help="viewport width in px (default 1280)")
    parser.add_argument("--max-height", type=int, default=16000, help="screenshot height cap in px")
    parser.add_argument("--budget-ms", type=int, default=15000, help="Chromium virtual time budget per page")
    parser.add_argument("--timeout", type=float, default=120, help="seconds before one Chromium run is abandoned")
    parser.add_argument("--jobs", type=int, default=2, help="pages rendered at once")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "chromium", help="Chromium binary")
    parser.add_argument("--only", nargs="*", default=None, metavar="GLOB",
                        help="check only the pages matching these globs (e.g. 'api/*')")
    parser.add_argument("--json", type=Path, default=None, help="also write the full report here")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        parser.error(f"site={args.site} has no index.html: build it first (mkdocs build --site-dir {args.site})")
    if shutil.which(args.chromium) is None:
        parser.error(f"chromium={args.chromium!r} not found: apt-get install -y chromium, or pass --chromium PATH")
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    reports = check_site(args.site, args)
    bad = [r for r in reports if r.problems()]
    for report in bad:
        for problem in report.problems():
            print(f"{report.page}: {problem}")
    print(f"{len(reports)} pages checked at {args.width} px in {time.perf_counter() - start:.0f} s: "
          f"{len(bad)} with problems" + (f"; screenshots in {args.screenshots}" if args.screenshots else ""))
    if args.json is not None:
        args.json.write_text(json.dumps([r.__dict__ for r in reports], indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
