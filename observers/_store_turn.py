"""Turn-taking at a single-writer store: the scanner threads of one worker process
take turns at the store work (:class:`StoreTurn`), and an observer whose own code waits
lets go of the turn while it runs (:class:`Waits`)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["StoreTurn", "Waits"]


class Waits:
    """How long an observer's code waits per run (wall time beyond its thread's CPU
    time), measured on runs that keep the store turn (where no other scanner competes
    for the GIL): its runs let go of the turn once that is :attr:`WAITING` seconds on
    average, and every :attr:`PROBE`-th run keeps it, to measure again."""

    WAITING = 0.0005
    PROBE = 32

    def __init__(self) -> None:
        self.mean = 0.0
        self.runs = 0

    def release(self) -> bool:
        """Whether the next run should let go of the turn (called holding it)."""
        self.runs += 1
        return self.mean >= self.WAITING and self.runs % self.PROBE != 0

    def measured(self, wall: float, cpu: float) -> None:
        """A run that kept the turn took *wall* seconds, *cpu* of them on its thread."""
        self.mean += 0.25 * (max(wall - cpu, 0.0) - self.mean)


class StoreTurn:
    """On a single-writer store, the scanners of one process take turns at the store
    work: store work of several threads at once only hands the GIL back and forth at
    every SQLite call and lock (4 threads drained at 0.42x the rate of 1). A scanner
    lets go of the turn while the code of an observer that waits (on I/O, say) runs
    (:class:`Waits`); one that keeps it through observer code that then takes longer
    than :attr:`LEND_AFTER` (a slow call, a hang) loses it to a waiting scanner, so a
    slow run never stalls the others. Only an order, for speed: a scanner that does
    store work without the turn (stopping) is still correct."""

    LEND_AFTER = 0.01

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._holder: int | None = None
        self._watcher: int | None = None
        self._in_observer_since: float | None = None

    def take(self, stop: threading.Event) -> bool:
        """Wait for the turn; False (without it) once *stop* is set. One waiter at a
        time looks every LEND_AFTER whether the holder's observer code is slow; the
        others sleep until woken (or a second, to see *stop*)."""
        me = threading.get_ident()
        with self._cond:
            while self._holder is not None and self._holder != me:
                since = self._in_observer_since
                if since is not None and time.monotonic() - since >= self.LEND_AFTER:
                    break  # the holder is in slow observer code: it lends the turn
                if stop.is_set():
                    if self._watcher == me:
                        self._watcher = None
                    return False
                if self._watcher is None:
                    self._watcher = me
                if self._watcher == me:
                    self._cond.wait(self.LEND_AFTER)
                else:
                    self._cond.wait(1.0)
            if self._watcher == me:
                self._watcher = None
                self._cond.notify()  # another waiter becomes the watcher
            self._holder, self._in_observer_since = me, None
            return True

    def give(self) -> None:
        with self._cond:
            if self._holder == threading.get_ident():
                self._holder = self._in_observer_since = None
                self._cond.notify()

    @contextlib.contextmanager
    def observer_code(self, waits: Waits, stop: threading.Event) -> Iterator[None]:
        """Around an observer's own code: let go of the turn if the observer waits,
        else keep it (lending it if the code turns out slow), and measure."""
        if waits.release():
            self.give()
            try:
                yield
            finally:
                self.take(stop)
            return
        with self._cond:
            self._in_observer_since = time.monotonic()
        began, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            waits.measured(time.perf_counter() - began, time.thread_time() - cpu)
            with self._cond:
                kept = self._holder == threading.get_ident()
                if kept:
                    self._in_observer_since = None
            if not kept:
                self.take(stop)
