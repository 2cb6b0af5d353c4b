"""Running test code in several threads at once, or as processes."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

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
