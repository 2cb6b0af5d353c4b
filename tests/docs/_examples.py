"""The code blocks of README.md and docs/, found and run as a reader would run them.

Each page runs on its own, as printed: in a new empty directory (the current
directory of its Python and shell blocks), its blocks in order, the Python blocks in
one namespace (a later block uses what an earlier one of the same page defined), each
shell block in one ``bash -e``. Nothing is given to a page that it does not show: no
``import``, no cluster, no file. The page runs from the wheel built from this
checkout, in a fresh virtualenv (tests/_wheel.py): its ``python`` and its
``percolator``, ``percolator-*`` commands (tests/docs/test_examples.py).

Markers are HTML comments right before a block (blank lines between are allowed),
invisible on GitHub and on the site:

* ``<!-- no-run: why -->`` the block is not run (it installs packages, needs Docker, a
  cluster or a machine of its own, or serves until stopped); the reason is required,
  and ``tests/docs/test_examples.py`` counts them per page (``NO_RUN``), so that a new
  one is a visible change;
* ``<!-- needs: spark -->`` the block needs PySpark and Java: its page runs in the
  Spark test (marked ``spark``), where ``SparkSession.builder...getOrCreate()`` in the
  page starts a local Spark (a page shows how it builds ``spark``).

There is no hidden setup: what a block needs (a repository, input files) is made by an
earlier block of its page, where the reader sees it.

Only ``python`` blocks and shell blocks (``bash``, ``sh``, ``shell``) are examples;
blocks without a language or of another one (a config file, a table, ``text`` output)
are text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "python"
SHELL = frozenset({"bash", "sh", "shell"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<lang>[^`\s]*)[^`]*$")
_COMMENT_END = re.compile(r"<!--(?P<body>(?:(?!<!--).)*?)-->\s*\Z", re.S)
_MARKER = re.compile(r"\A\s*(?P<name>[a-z_-]+)\s*:(?P<value>.*)\Z", re.S)
MARKERS = ("no-run", "needs")
SERVICES = ("spark",)


class MarkerError(ValueError):
    """A marker comment that cannot be obeyed: unknown, or without its reason."""


@dataclass
class Block:
    """One fenced block: where it is, its language, its code and its markers."""

    path: Path
    line: int  # 1-based line of the block's first code line
    lang: str
    code: str
    no_run: str | None = None
    needs: str | None = None

    @property
    def where(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{path}:{self.line}"

    @property
    def is_example(self) -> bool:
        return self.lang == PYTHON or self.lang in SHELL


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of *path* with the markers written right before each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    prose_start = 0
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            line = lines[j]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            j += 1
        block = Block(path, i + 2, opening["lang"].lower(), "\n".join(body) + "\n")
        _read_markers(block, "\n".join(lines[prose_start:i]))
        found.append(block)
        prose_start = i = j + 1
    return found


def _read_markers(block: Block, prose: str) -> None:
    """Take the comments that end *prose* (the text between the previous block and
    this one), innermost last, as this block's markers."""
    comments: list[str] = []
    while match := _COMMENT_END.search(prose):
        comments.insert(0, match["body"])
        prose = prose[: match.start()]
    for comment in comments:
        marker = _MARKER.match(comment)
        if marker and marker["name"] == "setup":
            raise MarkerError(f"{block.where}: hidden setup is not taken: show what the "
                              "block needs in a block of the page before it")
        if not marker or marker["name"] not in MARKERS:
            if marker and marker["name"].replace("_", "-") in (*MARKERS, "norun", "skip"):
                raise MarkerError(f"{block.where}: unknown marker {marker['name']!r}; "
                                  f"markers are {', '.join(MARKERS)}")
            continue  # an ordinary comment
        name, value = marker["name"], marker["value"].strip()
        if name == "no-run":
            if not value:
                raise MarkerError(f"{block.where}: no-run needs a reason: <!-- no-run: why -->")
            block.no_run = " ".join(value.split())
        elif name == "needs":
            if value not in SERVICES:
                raise MarkerError(f"{block.where}: needs one of {', '.join(SERVICES)}, "
                                  f"got {value!r}")
            block.needs = value
    if block.needs is not None and block.no_run is not None:
        raise MarkerError(f"{block.where}: a block that does not run needs nothing")
    if block.no_run is not None and not block.is_example:
        raise MarkerError(f"{block.where}: markers apply to python and shell blocks, "
                          f"not {block.lang or 'text'}")


def located(code: str, line: int) -> str:
    """*code* padded so that its line numbers are those of the page (tracebacks then
    point into the Markdown file)."""
    return "\n" * (line - 1) + code
