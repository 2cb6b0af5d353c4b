"""Retry policies (in the style of kazoo's ``KazooRetry``) and ``@transactional``."""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, overload

from percolator._errors import InvalidArgument, is_retryable

if TYPE_CHECKING:
    from percolator._cluster import Cluster
    from percolator._transaction import Transaction, TransactionBase

__all__ = ["RetryPolicy", "transactional"]

P = ParamSpec("P")
R = TypeVar("R")
# The transaction type the body declares. One signature, not overloads per type: mypy
# makes an overloaded call Any when an argument's type holds Any (a body taking a
# ``Feed[Any]``), which would switch the check off. Called with a Cluster the body gets
# a Transaction, which is what every body but a worker's internal one declares.
T = TypeVar("T", bound="TransactionBase")


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


def _classes() -> tuple[type[Cluster], type[Transaction], type[TransactionBase]]:
    """Cluster, Transaction and TransactionBase, imported at the first call (they import
    this module, so it cannot import them at its top) and kept, not looked up again at
    every call of a transactional function."""
    global _CLASSES
    if _CLASSES is None:
        from percolator._cluster import Cluster
        from percolator._transaction import Transaction, TransactionBase

        _CLASSES = (Cluster, Transaction, TransactionBase)
    return _CLASSES


_CLASSES: tuple[type[Cluster], type[Transaction], type[TransactionBase]] | None = None


@overload
def transactional(
    func: Callable[Concatenate[T, P], R],
) -> Callable[Concatenate[Cluster | T, P], R]: ...


@overload
def transactional(
    func: None = None,
    *,
    retry: RetryPolicy | None = None,
    retries: int | None = None,
    backoff: float | None = None,
) -> Callable[[Callable[Concatenate[T, P], R]], Callable[Concatenate[Cluster | T, P], R]]: ...


def transactional(
    func: Callable[..., Any] | None = None,
    *,
    retry: RetryPolicy | None = None,
    retries: int | None = None,
    backoff: float | None = None,
) -> Any:
    """Make a function of a transaction callable with a cluster or a transaction.

    Called with a :class:`~percolator.Cluster`, the wrapper begins a transaction, runs
    the body, commits, and on :class:`~percolator.ConflictError` or
    :class:`~percolator.LockedError` retries with jittered exponential backoff
    (policy *retry*, or the default with *retries* tries and *backoff* factor).
    Called with a transaction, it runs the body inside it, so decorated functions
    compose. Use bare (``@transactional``) or with options
    (``@transactional(retries=5)``). The default policy tries up to 30 times within
    60 seconds, waiting 2 ms doubled after each conflict (at most 0.2 s, jittered);
    *retries* sets the tries, *backoff* the factor and *retry* a whole
    :class:`RetryPolicy` (seconds).

    ::

        @percolator.transactional
        def transfer(txn, src: bytes, dst: bytes, amount: int) -> None:
            a = int(txn.get("accounts", src, "bal:v"))
            txn.set("accounts", src, "bal:v", str(a - amount).encode())
            ...

        transfer(cluster, b"alice", b"bob", 10)   # begins, runs, commits, retries
        with percolator.Transaction(cluster) as txn:
            transfer(txn, b"alice", b"bob", 10)   # part of the caller's transaction

    The wrapper's type is the body's with a :class:`Cluster` also accepted first (a
    body of ``txn: Transaction`` gives ``(Cluster | Transaction, src: bytes, ...)``),
    so a type checker catches a wrong call.

    Other exceptions (the body's own, or errors that a rerun would not fix, such as
    :class:`InvalidArgument`) propagate at once and nothing commits. Thread-safe: the
    wrapper keeps no state between calls.

    .. warning:: the body may run several times: keep side effects out of it.

    :raises ConflictError: when the retries are spent.
    :raises LockedError: when the retries are spent waiting for a live lock.
    :raises InvalidArgument: when the first argument is neither a :class:`Cluster` nor
        a transaction.
    """
    policy = retry or CONFLICT_RETRY
    if retries is not None:
        policy = policy.with_(max_tries=retries)
    if backoff is not None:
        policy = policy.with_(backoff=backoff)

    def decorate(
        body: Callable[Concatenate[Any, P], R],
    ) -> Callable[Concatenate[Any, P], R]:
        @functools.wraps(body)
        def run(target: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            Cluster, Transaction, TransactionBase = _classes()
            if isinstance(target, TransactionBase):
                return body(target, *args, **kwargs)
            if not isinstance(target, Cluster):
                raise InvalidArgument(
                    f"{body.__name__}() needs a Cluster or a transaction as first argument, "
                    f"got {type(target).__name__}"
                )
            attempts = policy.attempts()
            while True:
                txn = Transaction(target)
                try:
                    result = body(txn, *args, **kwargs)
                    txn.commit()
                    return result
                except Exception as error:
                    txn.rollback()
                    if not is_retryable(error) or not attempts.wait():
                        raise
                except BaseException:
                    txn.rollback()
                    raise

        return run

    if func is not None:
        return decorate(func)
    return decorate
