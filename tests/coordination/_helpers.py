"""Shared helpers of the coordination tests: child processes and lock inspection."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import percolator
from percolator._encoding import LOCK, Lock, decode_lock
from percolator._internals import internals
from percolator._store import Read

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def spawn(*args: str) -> subprocess.Popen[str]:
    """Start ``python -m tests.coordination._child ARGS`` with pipes on stdin and stdout."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen(
        [sys.executable, "-m", "tests.coordination._child", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env,
    )


@contextmanager
def child(*args: str) -> Iterator[subprocess.Popen[str]]:
    """A child process that is SIGKILLed (and reaped) whatever happens."""
    proc = spawn(*args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def read_line(proc: subprocess.Popen[str], prefix: str) -> str:
    """The next line of *proc* starting with *prefix* (without it)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    raise AssertionError(f"child exited (rc={proc.wait()}) before printing {prefix!r}")


def lock_of(cluster: percolator.Cluster, table: str, row: bytes, column: str) -> Lock | None:
    """The LOCKED state of a cell's lock, or None if the cell is not locked."""
    cells = internals(cluster).store.read_rows(table, [row], [Read(LOCK, (column,))]).get(row, {})
    versions = cells.get(f"{LOCK}:{column}")
    if not versions:
        return None
    state = decode_lock(versions[0][1])
    return state if isinstance(state, Lock) else None
