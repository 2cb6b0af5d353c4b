"""What every benchmark script shares: the machine's description and the writer of
its own section of BENCHMARKS.md (scripts run as ``python bench/NAME.py``)."""

from __future__ import annotations

import platform
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def head_commit() -> str:
    """The checkout's commit (short), with ``+dirty`` when it has uncommitted changes."""
    import subprocess

    here = Path(__file__).resolve().parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=here).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, cwd=here).stdout.strip()
    return head + ("+dirty" if dirty else "")


def write_section(heading: str, text: str, path: Path = BENCHMARKS) -> None:
    """Replace the section that starts with *heading* (a ``## `` line) by *text*, or
    append it; the other sections are left as they are."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    start = old.find(heading)
    if start < 0:
        new = old.rstrip("\n") + "\n\n" + text
    else:
        end = old.find("\n## ", start + len(heading))
        new = old[:start] + text.rstrip("\n") + "\n" + ("" if end < 0 else old[end:])
    path.write_text(new.rstrip("\n") + "\n")


def header(heading: str, command: str, *notes: str) -> list[str]:
    """The first lines of a section: heading, machine, date, command and *notes*."""
    import os
    import time

    return [heading, "",
            f"- machine: {platform.machine()}, {cpu_model()}, {os.cpu_count()} cores, "
            f"CPython {platform.python_version()}",
            f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
            f"- command: `{command}`", *(f"- {note}" for note in notes)]


def publish(heading: str, lines: list[str], write: bool) -> None:
    """Print the section, and with *write* put it in BENCHMARKS.md."""
    text = "\n".join(lines)
    print(text)
    if write:
        write_section(heading, text)
