// MathJax 3 configuration for pymdownx.arithmatex (generic mode): typeset only the maths arithmatex marked,
// i.e. \( ... \) and \[ ... \] inside elements of class "arithmatex". Loaded before the vendored tex-chtml.js.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex",
  },
  startup: {
    // after typesetting, let inline formulas wider than their line scroll sideways (docs/stylesheets/extra.css)
    pageReady: () => MathJax.startup.defaultPageReady().then(markWideInlineMaths),
  },
};

// MathJax 3 does not break inline maths across lines: a formula wider than its paragraph would spill over the
// page. Such formulas get the class "mjx-wide", which the site's CSS turns into a horizontally scrolling box.
function markWideInlineMaths() {
  for (const el of document.querySelectorAll('mjx-container[jax="CHTML"]:not([display="true"])')) {
    const parent = el.closest("p, li, dd, td, th, div") || el.parentElement;
    el.classList.remove("mjx-wide");
    if (el.getBoundingClientRect().width > parent.clientWidth) el.classList.add("mjx-wide");
  }
}
let wideTimer = null;
window.addEventListener("resize", () => {
  clearTimeout(wideTimer);
  wideTimer = setTimeout(markWideInlineMaths, 200);
});

// With mkdocs-material's instant navigation the page body is swapped without a reload: typeset the new body.
// document$ also emits for the first page, which MathJax typesets by itself at startup; re-typesetting that page
// (clearCache while the startup typeset runs) drops the glyph CSS and leaves every formula blank, so skip it.
if (typeof document$ !== "undefined") {
  let firstPage = true;
  document$.subscribe(() => {
    if (firstPage) {
      firstPage = false;
      return;
    }
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      MathJax.startup.promise.then(() => {
        MathJax.startup.output.clearCache();
        MathJax.typesetClear();
        MathJax.texReset();
        return MathJax.typesetPromise().then(markWideInlineMaths);
      });
    }
  });
}
