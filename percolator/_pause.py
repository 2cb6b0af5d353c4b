"""Named pause points: steps of a component's own threads (the oracle's allocator)
where a test may park the thread that reaches them (:class:`percolator.testing.PausePoint`).

A point costs one dictionary lookup when nothing is armed; it sits only on rare paths
(a ceiling persisted once per block of timestamps), never per transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["PausePoint", "arm", "disarm", "pause_point"]

_armed: dict[str, Callable[[], None]] = {}


def pause_point(name: str) -> None:
    """Run the hook armed at *name*, if any (it may block: that is the point)."""
    hook = _armed.get(name)
    if hook is not None:
        hook()


def arm(name: str, hook: Callable[[], None]) -> None:
    _armed[name] = hook


def disarm(name: str) -> None:
    _armed.pop(name, None)


class PausePoint:
    """Park the threads that reach the named pause point until released::

        with PausePoint("oracle.persist") as point:
            ...                          # something makes the oracle persist
            assert point.reached()       # its allocator thread is parked there
            ...                          # other actors run
            point.release()              # it carries on

    Armed for the life of the ``with`` block; threads still parked when it ends are
    released. *limit*: how many arrivals are parked (later ones pass).
    """

    def __init__(self, name: str, *, limit: int = 1) -> None:
        self.name = name
        self.limit = limit
        self.arrivals = 0
        self._arrived = threading.Condition()
        self._released = threading.Event()

    def _hook(self) -> None:
        with self._arrived:
            if self.arrivals >= self.limit:
                return
            self.arrivals += 1
            self._arrived.notify_all()
        self._released.wait()

    def reached(self, timeout: float = 30.0) -> bool:
        """Wait until a thread is parked here (up to *timeout* seconds)."""
        with self._arrived:
            return self._arrived.wait_for(lambda: self.arrivals > 0, timeout=timeout)

    def release(self) -> None:
        """Let the parked threads carry on, and every later arrival pass."""
        self._released.set()

    def __enter__(self) -> PausePoint:
        if self.name in _armed:
            raise RuntimeError(f"pause point {self.name!r} is already armed")
        arm(self.name, self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        disarm(self.name)
        self.release()
