"""Running test code in several threads at once."""

from __future__ import annotations

import threading
from collections.abc import Callable


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
