"""Griffe extension: the docstrings' reST, as Markdown for mkdocstrings.

The docstrings are written for Python's help() and in Sphinx's field style
(``:raises X:``, which griffe's sphinx parser understands), with reST roles and
directives that Markdown does not know. This rewrites them before parsing:
``:class:`~percolator.Snapshot``` becomes a cross-reference when the name is part of
the public API (``percolator.Snapshot``) and code otherwise; ``.. warning::`` an
admonition; a paragraph ending in ``::`` ends in ``:`` and the literal block after it
becomes a fenced Python block (tests/docs/test_docstrings.py checks that they are
Python), so that the site highlights it.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj):`~?\.?(?P<target>[^`]+)`")
_DIRECTIVE = re.compile(
    r"^(?P<indent>[ \t]*)\.\. (?P<kind>warning|note|seealso)::[ \t]*(?P<text>.*)$", re.M)
_LITERAL_BLOCK = re.compile(
    r"(?P<lead>\S?)::[ \t]*\n[ \t]*\n(?P<body>(?:[ \t]+\S.*\n|[ \t]*\n)+)")
_DOUBLE_BACKTICK = re.compile(r"``(?P<code>[^`]+?)``")


def _role(match: re.Match[str]) -> str:
    target = match["target"]
    shown = target.split(".")[-1] if match.group(0).find("~") >= 0 else target
    return f"`{shown.removesuffix('()')}`"


def _directive(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        found = _DIRECTIVE.match(lines[i])
        if not found:
            out.append(lines[i])
            i += 1
            continue
        indent = found["indent"]
        body = [found["text"]]
        i += 1
        while i < len(lines) and lines[i].startswith(indent + " ") and lines[i].strip():
            body.append(lines[i].strip())
            i += 1
        kind = "info" if found["kind"] == "seealso" else found["kind"]
        out.append(f"{indent}!!! {kind}")
        out.append("")
        out.extend(f"{indent}    {line}" for line in textwrap.wrap(" ".join(body), 88))
        out.append("")
    return "\n".join(out)


def _fence(match: re.Match[str]) -> str:
    body = textwrap.dedent(match["body"]).strip("\n")
    lead = match["lead"] + ":" if match["lead"] else ""
    return f"{lead}\n\n```python\n{body}\n```\n\n"


def markdown(text: str) -> str:
    """*text*, a docstring in reST, as the Markdown that mkdocstrings renders."""
    text = _ROLE.sub(_role, text)
    text = _DOUBLE_BACKTICK.sub(lambda m: f"`{m['code']}`", text)
    text = _directive(text)
    return _LITERAL_BLOCK.sub(_fence, text + "\n").rstrip("\n") + "\n"


class RestRoles(griffe.Extension):
    """Rewrites every docstring once, when griffe has loaded its object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
