"""Makes the package's docstrings read well as Markdown in the API reference.

The docstrings are written for ``help()``: usage examples as doctest runs (``>>>`` lines, which
Markdown would take for nested quotes) and Sphinx roles (``:class:`Rule```). This griffe
extension, loaded by mkdocstrings (``mkdocs.yml``), turns each run of doctest lines into a
fenced ``pycon`` block and each role into inline code; the docstrings themselves stay as they
are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj|const):`~?([^`]+)`")


def markdown_of(docstring: str) -> str:
    """``docstring`` with doctest runs fenced and Sphinx roles as inline code."""
    lines = _ROLE.sub(r"`\1`", docstring).splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if not stripped.startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = lines[i][: len(lines[i]) - len(stripped)]
        if out and out[-1].strip():
            out.append("")
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].lstrip().startswith((">>>", "...")):
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
        if i < len(lines) and lines[i].strip():
            out.append("")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Rewrites every docstring of the loaded package with :func:`markdown_of`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
