r"""The report every moestat result gives: :class:`Result` (``tidy``, ``glance``, ``summary``) and :class:`Summary`.

A fit (:class:`moestat.fit.base.FitResult`), a rate estimate (:class:`moestat.RateResult`), a bootstrap or a
likelihood-ratio test answers the same three questions, in the vocabulary of R's broom package:

* :meth:`Result.tidy` — the estimated quantities, one row per term, with ``estimate`` and, where there is
  inference, ``std_error``, ``conf_low``, ``conf_high`` (or ``statistic``, ``p_value`` for a test);
* :meth:`Result.glance` — one row per fitted unit (a replicate, a group x model) with its fit statistics,
  checks and settings;
* :meth:`Result.summary` — one printable :class:`Summary` (text, HTML, LaTeX).
"""

from __future__ import annotations

import abc
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

_TEX_SPECIAL = {"\\": r"\textbackslash{}", "_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$",
                "{": r"\{", "}": r"\}"}


def _tex(x: Any) -> str:
    """A cell or title as LaTeX text: floats with 4 decimals, specials escaped in one pass (no double escapes)."""
    text = f"{x:.4f}" if isinstance(x, (float, np.floating)) else str(x)
    return re.sub(r"[\\_%&#${}]", lambda m: _TEX_SPECIAL[m.group()], text)


def _tex_table(frame: pd.DataFrame) -> str:
    flat = frame.reset_index()
    rows = [" & ".join(_tex(c) for c in flat.columns) + r" \\ \hline"]
    rows += [" & ".join(_tex(v) for v in r) + r" \\" for r in flat.itertuples(index=False)]
    return "\\begin{tabular}{" + "l" * int(flat.shape[1]) + "}\n" + "\n".join(rows) + "\n\\end{tabular}"


@dataclass
class Summary:
    """A printable summary: header facts, a coefficient (or estimate) table, an optional second table, notes.

    One type for every result (:meth:`Result.summary`), shown as text (``str``), HTML (Jupyter,
    :meth:`as_html`) or LaTeX (:meth:`as_latex`)."""

    header: dict[str, Any]
    coef: pd.DataFrame
    components: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    title: str = "Gaussian mixture of experts: maximum likelihood"
    #: ``(title, table)`` pairs: when given, the renderers print these titled tables (e.g. one per gate row and
    #: expert, like flexmix's ``summary(refit(m))``) instead of ``coef`` as one table; ``coef`` keeps the flat rows.
    blocks: list[tuple[str, pd.DataFrame]] = field(default_factory=list)

    def _header_lines(self) -> list[str]:
        items = list(self.header.items())
        half = (len(items) + 1) // 2
        lines = []
        for left, right in zip(items[:half], items[half:] + [("", "")] * (2 * half - len(items)), strict=True):
            lt = f"{left[0] + ':':<16}{left[1]!s:>26}"
            rt = f"{right[0] + ':':<16}{right[1]!s:>26}" if right[0] else ""
            lines.append(f"{lt}    {rt}")
        return lines

    def as_text(self) -> str:
        w = 88
        lines = ["=" * w, self.title.center(w), "=" * w, *self._header_lines()]
        with pd.option_context("display.float_format", "{:.4f}".format, "display.width", w):
            if self.blocks:
                for title, table in self.blocks:
                    lines += ["-" * w, title, table.to_string()]
                if len(self.components):
                    lines += ["-" * w, "Components", self.components.to_string()]
            else:
                lines += ["-" * w, self.coef.to_string()]
                if len(self.components):
                    lines += ["-" * w, self.components.to_string()]
        lines.append("=" * w)
        lines += [f"Note: {n}" for n in self.notes]
        return "\n".join(lines)

    def as_html(self) -> str:
        """The summary as an HTML fragment (header table, the coefficient table or one titled table per block,
        the component table, notes)."""
        import html

        head = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                       for k, v in self.header.items())
        parts = [f"<h4>{html.escape(self.title)}</h4>", f"<table>{head}</table>"]
        if self.blocks:
            for title, table in self.blocks:
                parts += [f"<h5>{html.escape(title)}</h5>", table.to_html(float_format="{:.4f}".format)]
            if len(self.components):
                parts += ["<h5>Components</h5>", self.components.to_html(float_format="{:.4f}".format)]
        else:
            parts.append(self.coef.to_html(float_format="{:.4f}".format))
            if len(self.components):
                parts.append(self.components.to_html(float_format="{:.4f}".format))
        parts += [f"<p>Note: {html.escape(n)}</p>" for n in self.notes]
        return "\n".join(parts)

    _repr_html_ = as_html

    def as_latex(self) -> str:
        """The summary as LaTeX ``tabular`` environments (no package beyond base LaTeX); blocks get a bold title."""
        head = pd.DataFrame({"value": [str(v) for v in self.header.values()]},
                            index=pd.Index([str(k) for k in self.header], name="item"))
        parts = [f"% {_tex(self.title)}", _tex_table(head)]
        if self.blocks:
            for title, table in self.blocks:
                parts.append(f"\\noindent\\textbf{{{_tex(title)}}}\\par\n" + _tex_table(table.rename_axis("term")))
            if len(self.components):
                parts.append("\\noindent\\textbf{Components}\\par\n" + _tex_table(self.components))
        else:
            parts.append(_tex_table(self.coef))
            if len(self.components):
                parts.append(_tex_table(self.components))
        parts += [f"% Note: {_tex(n)}" for n in self.notes]
        return "\n\n".join(parts)

    def __str__(self) -> str:
        return self.as_text()

    def __repr__(self) -> str:
        return self.as_text()

    def __contains__(self, text: str) -> bool:
        """Whether ``text`` appears in the printed summary (``"curved" in res.summary()``)."""
        return text in self.as_text()


class Result(abc.ABC):
    """Base of moestat's results: :meth:`tidy`, :meth:`glance` and :meth:`summary` (see the module docstring)."""

    @abc.abstractmethod
    def tidy(self) -> pd.DataFrame:
        """The estimated quantities, one row per term."""

    @abc.abstractmethod
    def glance(self) -> pd.DataFrame:
        """One row per fitted unit: fit statistics, checks and settings."""

    def summary(self) -> Summary:
        """A printable :class:`Summary`: :meth:`glance` facts as the header (one unit) or table, :meth:`tidy`."""
        g = self.glance()
        header: dict[str, Any] = {}
        second = pd.DataFrame()
        if len(g) == 1:
            header = {str(k): (f"{v:.6g}" if isinstance(v, float) else v) for k, v in g.iloc[0].items()}
        else:
            second = g
        return Summary(header, self.tidy(), second, [], title=type(self).__name__)
