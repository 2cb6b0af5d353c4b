"""Retry policies (in the style of kazoo's ``KazooRetry``): how often and how long a
conflicted transaction (``@transactional``, :mod:`percolator._transactional`) or a read
waiting for a lock tries again."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

from percolator._errors import InvalidArgument

__all__ = ["CONFLICT_RETRY", "LOCK_WAIT", "Attempts", "RetryPolicy"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry.

    ``max_tries`` bounds the attempts (None: only the deadline bounds them); the n-th
    wait is ``delay * backoff**n`` capped at ``max_delay``, plus up to ``max_jitter``
    of itself at random; ``deadline`` (seconds, None: none) bounds the total time.
    """

    max_tries: int | None = 50
    delay: float = 0.002
    backoff: float = 2.0
    max_jitter: float = 0.5
    max_delay: float = 0.5
    deadline: float | None = 60.0

    def __post_init__(self) -> None:
        if self.max_tries is not None and self.max_tries < 1:
            raise InvalidArgument(f"max_tries must be >= 1 or None, got {self.max_tries!r}")
        for name in ("delay", "backoff", "max_jitter", "max_delay"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must be >= 0, got {getattr(self, name)!r}")

    def with_(self, **changes: Any) -> RetryPolicy:
        """A copy with *changes* (field names as keywords), validated like a new one::

            patient = RetryPolicy().with_(max_tries=None, deadline=300.0)
        """
        return replace(self, **changes)

    def attempts(self, stop: threading.Event | None = None) -> Attempts:
        """A fresh counter for one operation (policies are shared, counters are not);
        its waits end early, and the attempts with them, once *stop* is set."""
        return Attempts(self, stop)


class Attempts:
    """The state of one retried operation."""

    def __init__(self, policy: RetryPolicy, stop: threading.Event | None = None) -> None:
        self.policy = policy
        self.tries = 1
        self._start = time.monotonic()
        self._stop = stop
        # Grown by multiplication and capped, never as backoff ** tries: that power
        # overflows a float (OverflowError) after ~1,500 tries of a long lock wait.
        self._pause = min(policy.delay, policy.max_delay)

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def wait(self) -> bool:
        """Sleep before the next try; False when the policy is spent (without sleeping)
        or when the stop event is set (at once)."""
        p = self.policy
        if p.max_tries is not None and self.tries >= p.max_tries:
            return False
        pause = self._pause
        self._pause = min(pause * p.backoff, p.max_delay)
        pause += random.uniform(0, pause * p.max_jitter)
        if p.deadline is not None and self.elapsed() + pause > p.deadline:
            return False
        if self._stop is None:
            time.sleep(pause)
        elif self._stop.wait(pause):
            return False
        self.tries += 1
        return True


CONFLICT_RETRY = RetryPolicy(max_tries=30, delay=0.002, max_delay=0.2, deadline=60.0)
"""Default of ``@transactional``: rerun the body after a conflict."""
LOCK_WAIT = RetryPolicy(max_tries=None, delay=0.001, backoff=1.6, max_delay=0.1, deadline=None)
"""Waiting for a live transaction's lock (the deadline is set from the lock ttl)."""
