"""The one error hierarchy of the library.

::

    PercolatorError
    ├── InvalidArgument (also ValueError)
    │   ├── UnknownTableError
    │   └── ValueTooLargeError
    ├── TransactionClosedError
    ├── ConflictError            retryable: another transaction won the race
    ├── LockedError              retryable: a live transaction holds a lock we need
    ├── CommitUnknownError       the outcome is undetermined: never retried blindly
    ├── SnapshotTooOldError      the start timestamp is below the GC safe point
    ├── StoreUnavailable         the store cannot be reached (names the store)
    ├── OracleUnavailable        no timestamp oracle answered within the deadline
    ├── CoordinationError        ZooKeeper (or the local coordinator) failed us
    ├── TlsError                 a TLS handshake cannot succeed: says which side refused, why
    └── ObserverError            an observer failed (carries the row and the cause)

``is_retryable(e)`` says whether running the whole transaction again may succeed.
"""

from __future__ import annotations


class PercolatorError(Exception):
    """Base of every error this library raises on purpose."""


class InvalidArgument(PercolatorError, ValueError):
    """An argument has the wrong type or value; the message quotes it."""


class UnknownTableError(InvalidArgument):
    """The table does not exist (create it with ``Cluster.create_table``)."""

    def __init__(self, table: str) -> None:
        super().__init__(
            f"table {table!r} does not exist; create it first with cluster.create_table({table!r})"
        )
        self.table = table


class ValueTooLargeError(InvalidArgument):
    """A value, row key or column name is over its documented size limit."""


class TransactionClosedError(PercolatorError):
    """The transaction was already committed, rolled back or closed."""


class ConflictError(PercolatorError):
    """A write-write conflict: another transaction wrote or locked a cell we write.

    ``start_ts`` is ours; ``conflict_ts`` is the other transaction's commit (or
    start) timestamp, when known.
    """

    def __init__(
        self,
        message: str,
        *,
        start_ts: int,
        conflict_ts: int | None = None,
        table: str | None = None,
        row: bytes | None = None,
        column: str | None = None,
    ) -> None:
        super().__init__(message)
        self.start_ts = start_ts
        self.conflict_ts = conflict_ts
        self.table = table
        self.row = row
        self.column = column


class LockedError(PercolatorError):
    """A live transaction kept a lock we must wait for beyond the wait deadline."""

    def __init__(self, message: str, *, table: str, row: bytes, column: str, lock_ts: int) -> None:
        super().__init__(message)
        self.table = table
        self.row = row
        self.column = column
        self.lock_ts = lock_ts


class CommitUnknownError(PercolatorError):
    """The commit's outcome could not be determined (the store failed at the commit point).

    The transaction may or may not have committed; retrying blindly could apply it twice.
    """


class SnapshotTooOldError(PercolatorError):
    """The transaction's start timestamp is below the garbage-collection safe point:
    versions it may need can have been removed, so it reads and commits nothing more.

    Not retryable as it stands (the same start timestamp stays too old); a new
    transaction gets a fresh start timestamp. ``start_ts`` is the transaction's,
    ``safe_point`` the safe point that overtook it; *what* names the reader in the
    message (``"transaction"``, or ``"snapshot"`` for a :class:`Snapshot`).
    """

    def __init__(self, start_ts: int, safe_point: int, what: str = "transaction") -> None:
        open_one = "start a new transaction" if what == "transaction" else f"open a new {what}"
        super().__init__(
            f"{what} {start_ts} is too old: the garbage-collection safe point is "
            f"{safe_point}, and versions older than it may be gone; {open_one} (keep "
            f"{what}s shorter than the GC retention and max_txn_age, or raise them)"
        )
        self.start_ts = start_ts
        self.safe_point = safe_point


class StoreUnavailable(PercolatorError):
    """The store could not be reached or failed; the message names the store."""


class OracleUnavailable(PercolatorError):
    """No timestamp oracle answered within the deadline; the message names the target."""


class CoordinationError(PercolatorError):
    """The coordination service (ZooKeeper) failed or our session there was lost."""


class TlsError(PercolatorError):
    """A TLS connection (oracle or ZooKeeper) cannot be made: the certificate of one side is
    not trusted (wrong CA, expired, wrong host name), a required client certificate is
    missing, or one side speaks TLS and the other plaintext. The message says which side
    refused and why. Raised at once rather than retried: a retry cannot fix it."""


class ObserverError(PercolatorError):
    """An observer raised; ``__cause__`` holds the original exception."""


def is_retryable(error: BaseException) -> bool:
    """Whether running the whole transaction again may succeed."""
    return isinstance(error, ConflictError | LockedError)


# Shown by where users import them from: a traceback then reads
# ``percolator.StoreUnavailable: ...``, the name the docs use and ``except`` can catch,
# not the private module's ``percolator._errors.StoreUnavailable``.
for _error in (PercolatorError, InvalidArgument, UnknownTableError, ValueTooLargeError,
               TransactionClosedError, ConflictError, LockedError, CommitUnknownError,
               SnapshotTooOldError, StoreUnavailable, OracleUnavailable, CoordinationError,
               TlsError, ObserverError):
    _error.__module__ = "percolator"
del _error
