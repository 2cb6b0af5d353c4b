"""``@transactional``: run a function of a transaction in a transaction of its own,
retried after conflicts, or inside the caller's.

Apart from :mod:`percolator._retry` (the policies), which the transaction and the
cluster import: this module imports both of them, at its top, and neither imports it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from percolator._cluster import Cluster
from percolator._errors import InvalidArgument, is_retryable
from percolator._retry import CONFLICT_RETRY, RetryPolicy
from percolator._transaction import Transaction, TransactionBase

__all__ = ["transactional"]

P = ParamSpec("P")
R = TypeVar("R")
# The transaction type the body declares. One signature, not overloads per type: mypy
# makes an overloaded call Any when an argument's type holds Any (a body taking a
# ``Feed[Any]``), which would switch the check off. Called with a Cluster the body gets
# a Transaction, which is what every body but a worker's internal one declares.
T = TypeVar("T", bound="TransactionBase")


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
