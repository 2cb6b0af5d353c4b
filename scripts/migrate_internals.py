"""One-off (issue 34): rewrite callers of the Cluster attributes that moved to
``percolator._internals``, for merging branches written before the move; delete it once
they are merged.

Every place where mypy reports ``"Cluster" has no attribute "X"`` for a moved X becomes
``internals(<expr>).X`` (``check_table_exists`` becomes ``require_table``), and the file
imports ``internals``; a receiver too complex to rewrite is listed for a hand edit.
What mypy cannot see (lines under ``type: ignore``, code in strings, untyped
receivers) is left: grep for the moved names after. ruff then sorts the imports::

    python scripts/migrate_internals.py percolator observers spark_loader oracle
    python scripts/migrate_internals.py --check-untyped-defs --follow-imports=silent tests
    python -m ruff check --fix --select I percolator observers spark_loader tests bench

then wrap by hand the lines ruff finds too long (E501).

Run it until it changes nothing (a line with two moved names takes two runs).
"""

from __future__ import annotations

import ast
import collections
import re
import subprocess
import sys
from pathlib import Path

MOVED = {"store", "timestamps", "coordination", "stats", "wakeups", "lock_census",
         "safe_point", "read_predictions", "lock_wait_policy", "taking_locks", "sweep_locks",
         "wake_observers", "check_table_exists"}
RENAMED = {"check_table_exists": "require_table"}
IMPORT = "from percolator._internals import internals"
_ERROR = re.compile(r'^(?P<file>[^:]+):(?P<line>\d+):(?P<col>\d+): error: '
                    r'"Cluster" has no attribute "(?P<name>\w+)"')


def _add_import(source: str) -> str:
    """*source* with IMPORT after its last top-level import (never inside a string)."""
    if IMPORT in source:
        return source
    tree = ast.parse(source)
    last = max((n.end_lineno or n.lineno for n in tree.body
                if isinstance(n, ast.Import | ast.ImportFrom)), default=0)
    lines = source.split("\n")
    lines.insert(last, IMPORT)
    return "\n".join(lines)


def main(mypy_args: list[str]) -> int:
    out = subprocess.run([sys.executable, "-m", "mypy", "--show-column-numbers",
                          "--no-error-summary", *mypy_args],
                         capture_output=True, text=True, check=False).stdout
    found: dict[str, set[tuple[int, int, str]]] = collections.defaultdict(set)
    for line in out.splitlines():
        if (m := _ERROR.match(line)) and m["name"] in MOVED:
            found[m["file"]].add((int(m["line"]), int(m["col"]), m["name"]))
    for path, places in sorted(found.items()):
        lines = Path(path).read_text().split("\n")
        changed = 0
        # Right to left within a line, so that earlier columns stay valid.
        for number, col, name in sorted(places, key=lambda p: (p[0], -p[1])):
            text, start = lines[number - 1], col - 1
            attr = re.compile(rf"\.{name}\b").search(text, start)
            receiver = text[start:attr.start()] if attr else ""
            if (not attr or not re.fullmatch(r"[\w.\[\]()]+", receiver)
                    or receiver.count("(") != receiver.count(")")):
                print(f"{path}:{number}: by hand: {text.strip()}")
                continue
            lines[number - 1] = (text[:start] + f"internals({receiver})."
                                 f"{RENAMED.get(name, name)}" + text[attr.end():])
            changed += 1
        if changed:
            Path(path).write_text(_add_import("\n".join(lines)))
            print(f"{path}: {changed} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
