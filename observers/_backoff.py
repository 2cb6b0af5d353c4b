"""This worker process's back-off of failing cells: how often each failed here, and
when to try it next. The count that ends in quarantine is the cluster's, in the
store (:func:`percolator._notifications.record_failure`); this one only spaces this
process's tries."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Backoff", "Failures"]

Cell = tuple[str, bytes, str]
"""``(table, row, column)``."""


@dataclass(slots=True)
class Failures:
    """This process's back-off for one failing cell: its failures, and when to try next."""

    count: int
    next_try: float


class Backoff:
    """The failing cells of one worker process (shared by its scanner threads: the
    scanner skips a cell that is backing off, the runner records and clears
    failures). Empty, as it almost always is, each question costs a truth test."""

    def __init__(self, retry_delay: float, max_retry_delay: float) -> None:
        self.retry_delay = retry_delay
        self.max_retry_delay = max_retry_delay
        self._failures: dict[Cell, Failures] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        """Whether any cell failed here and was not cleared since."""
        return bool(self._failures)

    def waiting(self, table: str, row: bytes, column: str) -> bool:
        """Whether the cell failed here and its next try is not due yet."""
        if not self._failures:
            return False
        with self._lock:
            failure = self._failures.get((table, row, column))
        return failure is not None and failure.next_try > time.monotonic()

    def all_waiting(self, table: str, row: bytes, columns: Iterable[str]) -> bool:
        """Whether every one of *columns* of the row waits (a scanner passes it by)."""
        if not self._failures:
            return False
        now = time.monotonic()
        with self._lock:
            for column in columns:
                failure = self._failures.get((table, row, column))
                if failure is None or failure.next_try <= now:
                    return False
        return True

    def failing(self, table: str, row: bytes, columns: Iterable[str]) -> bool:
        """Whether any of *columns* of the row failed here and was not cleared since,
        its next try due or not."""
        if not self._failures:
            return False
        with self._lock:
            return any((table, row, column) in self._failures for column in columns)

    def next_due(self) -> float | None:
        """The ``time.monotonic()`` of the earliest next try, if any cell failed."""
        if not self._failures:
            return None
        with self._lock:
            return min((f.next_try for f in self._failures.values()), default=None)

    def failed(self, table: str, row: bytes, column: str) -> float:
        """Count one more failure of the cell; returns the seconds until its next try
        (*retry_delay*, doubled per failure up to *max_retry_delay*, jittered)."""
        key = (table, row, column)
        with self._lock:
            failure = self._failures.get(key) or Failures(0, 0.0)
            failure.count += 1
            delay: float = min(self.retry_delay * 2 ** (failure.count - 1),
                               self.max_retry_delay)
            failure.next_try = time.monotonic() + delay * random.uniform(0.8, 1.2)
            self._failures[key] = failure
        return delay

    def clear(self, table: str, row: bytes, column: str) -> bool:
        """Forget the cell's failures; True if it had any."""
        if not self._failures:
            return False
        with self._lock:
            return self._failures.pop((table, row, column), None) is not None
