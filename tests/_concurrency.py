"""Running test code in several threads at once, or as processes, and actors stopped
at a step of their commit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from percolator import TransactionBase
from percolator._commit import SimulatedCrash, commit_transaction
from percolator.testing import CrashPoint

ROOT = Path(__file__).resolve().parents[1]


def run_concurrently(target: Callable[[int], None], threads: int) -> None:
    """Call ``target(i)`` for i in ``range(threads)``, each in its own thread, all
    released at once; fail with the first error any of them raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(threads)

    def run(i: int) -> None:
        try:
            barrier.wait()
            target(i)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    started = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    assert errors == []


def spawn_module(module: str, *args: str, env: dict[str, str] | None = None
                 ) -> subprocess.Popen[bytes]:
    """``python -m module args`` from the repository root (this checkout's code), its
    output discarded: a worker process for a test to kill."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


class ParkedAfterCommit:
    """A cluster's store whose one-phase commit made by *thread* stops after its
    COMMIT (the end of its atomic step), before its in-flight slot is cleared, until
    :attr:`proceed` is set (at most 10 s); :attr:`committed` tells it got there."""

    def __init__(self, store: Any, thread: threading.Thread | None = None) -> None:
        self._store = store
        self.thread = thread
        self.committed = threading.Event()
        self.proceed = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    @contextmanager
    def atomically(self) -> Iterator[None]:
        with self._store.atomically():
            yield
        if threading.current_thread() is self.thread:
            self.committed.set()
            self.proceed.wait(10)


def hold_locks(txn: TransactionBase) -> None:
    """Commit *txn* through its prewrite and stop there, as a client paused after
    locking: its locks stay, and its owner (this process's client) lives on."""
    with pytest.raises(SimulatedCrash):
        commit_transaction(txn, CrashPoint("prewrite", 0))
