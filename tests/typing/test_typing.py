"""The public API's type hints catch wrong calls: mypy, run on a snippet, reports
exactly the errors the snippet marks (``# E: <code>``), and nothing on the other lines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = sorted(Path(__file__).parent.glob("snippet_*.py"))
_MARK = re.compile(r"#\s*E:\s*(?P<code>[\w-]+)\s*$")
_ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")


def _expected(snippet: Path) -> set[tuple[int, str]]:
    return {(n, m["code"]) for n, line in enumerate(snippet.read_text().splitlines(), 1)
            if (m := _MARK.search(line))}


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda p: p.name)
def test_mypy_reports_exactly_the_marked_errors(snippet: Path, tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    expected = _expected(snippet)
    assert expected, f"{snippet.name} marks no error: it would test nothing"
    # From the worktree's root, so that mypy reads these sources, not an installed copy;
    # errors inside the packages are not this test's business (silent imports).
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "setup.cfg"),
         "--follow-imports", "silent", "--cache-dir", str(tmp_path / "cache"),
         "--no-error-summary", "--show-error-codes", "--hide-error-context",
         str(snippet.relative_to(ROOT))],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    if done.returncode not in (0, 1) or done.stderr.strip():
        pytest.fail(f"mypy failed to run ({done.returncode}): {done.stderr}{done.stdout}")
    found = set()
    for line in done.stdout.splitlines():
        if (m := _ERROR.match(line)) and Path(m["file"]).name == snippet.name:
            found.add((int(m["line"]), m["code"]))
    assert found == expected, (
        f"missing: {sorted(expected - found)}; unexpected: {sorted(found - expected)}\n"
        + done.stdout
    )
