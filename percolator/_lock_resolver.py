"""Lazy lock resolution (Percolator §2.2; DESIGN.md §5).

A lock of transaction X found by a reader or a writer is resolved by asking X's
primary: committed -> roll the cell forward (write record, notify, FREE); rolled
back -> free it; still locked -> wait, unless X's owner is dead or its wall time is
past its ttl, in which case the primary is rolled back with one compare-and-set
(the only step that can race with X's own commit point: exactly one wins).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from percolator._cas import holds, lock_cas
from percolator._encoding import (
    LOCK,
    NOTIFY,
    WRITE,
    Committed,
    Free,
    Lock,
    RolledBack,
    WriteKind,
    decode_lock,
    decode_write,
    encode_lock,
    encode_write,
)
from percolator._errors import StoreUnavailable
from percolator._store import Mutation, Read, Store
from percolator.metrics import inc as _inc

if TYPE_CHECKING:
    from percolator._coordination import Coordination

__all__ = [
    "CommitsInFlight", "LockHost", "TxnStatus", "check_txn_status", "resolve_lock",
    "write_cells",
]


class LockHost(Protocol):
    """What resolving a lock uses of a cluster's parts: its store, its coordination (is
    the lock's owner alive?) and its counters. A cluster's
    :class:`~percolator._internals.Internals` (``internals(cluster)``) is one; the public
    :class:`~percolator.Cluster` is not (it shows none of them). The resolver needs
    nothing else (no transactions, no GC, no observers)."""

    @property
    def store(self) -> Store: ...

    @property
    def coordination(self) -> Coordination: ...

    @property
    def stats(self) -> MutableMapping[str, int]: ...

log = logging.getLogger(__name__)

NOTIFY_STRONG = b"1"


@dataclass(frozen=True, slots=True)
class TxnStatus:
    """The fate of a transaction as its primary tells it."""

    start_ts: int
    commit_ts: int | None = None
    """Set when committed."""
    rolled_back: bool = False
    pending: Lock | None = None
    """The primary's lock while undecided."""
    pending_raw: bytes | None = None

    @property
    def committed(self) -> bool:
        return self.commit_ts is not None


def write_cells(
    column: str, start_ts: int, commit_ts: int, delete: bool, notify: bool,
    value: bytes | None = None,
) -> list[tuple[str, int, bytes]]:
    """The write record (and notify cell) that make a locked cell's change visible;
    a put's *value*, when given, is inlined in the record."""
    kind = WriteKind.DELETE if delete else WriteKind.PUT
    cells = [(f"{WRITE}:{column}", commit_ts, encode_write(kind, start_ts, value))]
    if notify:
        cells.append((f"{NOTIFY}:{column}", commit_ts, NOTIFY_STRONG))
    return cells


def release(
    parts: LockHost,
    table: str,
    row: bytes,
    column: str,
    held: bytes,
    start_ts: int,
    commit: tuple[int, bool, bool] | None,
    *,
    recorded: bool = False,
    inline: bytes | None = None,
) -> bool:
    """Move a lock cell from *held* to FREE, first making the outcome durable.

    *commit* is ``(commit_ts, delete, notify)`` for a committed transaction (its write
    record and notify cell are written, atomically with the release where the
    store can) or None for a rolled-back one. *recorded*: on a store without atomic
    row CAS the caller already wrote them (in a batch), so only the lock is freed.
    *inline*: the put's value, carried in its write record. Returns whether the CAS won;
    False too when its answer was lost and the cell has left *held* since.
    """
    store = parts.store
    free = encode_lock(Free(start_ts, commit is not None))
    puts = write_cells(column, start_ts, *commit, inline) if commit is not None else []
    if puts and not store.atomic_row_cas:
        if not recorded:
            store.mutate_rows(table, [Mutation(row, puts)])
        puts = []
    lock_column = f"{LOCK}:{column}"
    try:
        return lock_cas(store, table, row, lock_column, held, free, puts)
    except StoreUnavailable:
        # A release only carries out an outcome already decided, and a lock cell leaves
        # a decided or secondary value only once that outcome's records are written
        # (by this call, its answer lost, or by another resolver; a call of ours still
        # on its way then fails its compare). So a cell that has left *held* is released
        # whoever did it, and its caller reads again; lock_cas alone cannot say so,
        # since the cell no longer holds our FREE (a new lock may be there already).
        try:
            if not holds(store, table, row, lock_column, held):
                return False
        except StoreUnavailable:
            pass
        raise


def check_txn_status(parts: LockHost, lock: Lock) -> TxnStatus:
    """Read X's primary (lock cell first, then write records, in one row read) and
    tell whether X committed, rolled back, or is pending. Finishes the clean-up of a
    primary caught between its decision and FREE."""
    table, row, column = lock.primary_table, lock.primary_row, lock.primary_column
    start_ts = lock.start_ts
    cells = parts.store.read_rows(
        table,
        [row],
        [Read(LOCK, (column,)), Read(WRITE, (column,), min_ts=start_ts, versions=None)],
    ).get(row, {})
    lock_cell = cells.get(f"{LOCK}:{column}")
    raw = lock_cell[0][1] if lock_cell else None
    state = decode_lock(raw) if raw is not None else None
    if isinstance(state, Lock) and state.start_ts == start_ts:
        return TxnStatus(start_ts, pending=state, pending_raw=raw)
    if isinstance(state, Committed) and state.start_ts == start_ts:
        assert raw is not None
        release(parts, table, row, column, raw, start_ts,
                (state.commit_ts, state.delete, state.notify), inline=state.value)
        return TxnStatus(start_ts, commit_ts=state.commit_ts)
    if isinstance(state, RolledBack) and state.start_ts == start_ts:
        assert raw is not None
        release(parts, table, row, column, raw, start_ts, None)
        return TxnStatus(start_ts, rolled_back=True)
    for ts, value in cells.get(f"{WRITE}:{column}", []):
        kind, data_ts = decode_write(value)
        if data_ts == start_ts:
            if kind is WriteKind.ROLLBACK:
                return TxnStatus(start_ts, rolled_back=True)
            return TxnStatus(start_ts, commit_ts=ts)
    # The primary is locked first, so a lock of X elsewhere means X locked its primary;
    # with neither lock nor write record left there, X was rolled back.
    return TxnStatus(start_ts, rolled_back=True)


def _expired(lock: Lock) -> bool:
    return time.time() * 1000 > lock.wall_ms + lock.ttl_ms


class _Flight:
    """One two-phase commit of this client under way (:class:`CommitsInFlight`)."""

    __slots__ = ("commit_ts", "committed")

    def __init__(self) -> None:
        self.commit_ts = 0
        """Its commit timestamp, once drawn (0: not yet)."""
        self.committed: bool | None = None
        """True once its commit point won; False once nothing of it can commit (it gave
        up before its commit point, or lost it); None while undecided or unknown."""


UNTOLD = object()
"""What :meth:`CommitsInFlight.settle` answers when the commit's own process cannot
tell (not a commit of this client, one undecided past the wait, or one whose outcome
its committer does not know): the lock is resolved through the store, as any other."""

ENDED = object()
"""What :meth:`CommitsInFlight.settle` answers when the commit ended without knowing its
outcome (a store failure at its commit point, a simulated crash): its locks are left to
readers, so the row is read again, and then resolved through the store."""

_ENDED_KEPT = 1024

SETTLE_WAIT = 0.1
"""Seconds a read waits at most, in one go, for a commit of its own client to tell what
the read sees; past it, the lock is resolved through the store (the lock wait policy,
its deadline and its stop event), and the read looks here again next time round."""


class CommitsInFlight:
    """This client's two-phase commits under way, by start timestamp: a read of this
    process that meets the lock of one learns from the committer itself what it sees,
    without a store call, as soon as the committer knows:

    * once its commit timestamp is drawn above the read's start timestamp, or it can no
      longer commit at all: nothing of it (the lock hides no change at or below the
      read's start, and the write records the read found are the cell's);
    * once its commit point won at or below the read's start: the write record that
      the commit writes (the lock's value, or its data cell), which no other commit
      can precede while the lock is held (DESIGN.md section 5, invariant A).

    Until then the read waits on this client's condition, not on the store: with the
    threads of one process sharing its CPU, asking the lock's primary again and again
    took the time the holder needed to finish, and waiting for the holder's end (its
    secondaries' releases too) kept readers waiting past what they needed to know. A
    client of its own per identity (:meth:`~percolator._internals.Internals.for_client`);
    off (``watched=False``) in a deterministic interleaving, whose actors block only at
    store calls."""

    __slots__ = ("_changed", "_ended", "_flights", "watched")

    def __init__(self, *, watched: bool = True) -> None:
        self._flights: dict[int, _Flight] = {}
        self._ended: dict[int, _Flight] = {}
        """The last commits that ended (at most _ENDED_KEPT), as they ended: a lock of
        one met by a read made before its end is read again, not resolved, and a
        prewrite that meets it knows whether it committed after its start."""
        self._changed = threading.Condition(threading.Lock())
        self.watched = watched
        """False: no commit is recorded, and every lock is resolved through the store."""

    def begin(self, start_ts: int) -> _Flight | None:
        """Record the commit of *start_ts*, about to take its locks (None: not watched)."""
        if not self.watched:
            return None
        flight = _Flight()
        with self._changed:
            self._flights[start_ts] = flight
        return flight

    def tell(self, flight: _Flight | None, *, commit_ts: int = 0,
             committed: bool | None = None) -> None:
        """What the commit of *flight* now knows: its commit timestamp drawn, or its
        outcome decided."""
        if flight is None:
            return
        with self._changed:
            if commit_ts:
                flight.commit_ts = commit_ts
            if committed is not None:
                flight.committed = committed
            self._changed.notify_all()

    def end(self, start_ts: int, *, forget: bool = False) -> None:
        """The commit of *start_ts* is over: readers waiting on it are woken, and told
        its outcome as it ended, unless *forget* (a simulated crash: its process knows
        nothing more)."""
        with self._changed:
            flight = self._flights.pop(start_ts, None)
            if forget:
                self._changed.notify_all()
            elif flight is not None:
                ended = self._ended
                ended[start_ts] = flight
                if len(ended) > _ENDED_KEPT:
                    del ended[next(iter(ended))]
                self._changed.notify_all()

    def committed_after(self, lock: Lock, start_ts: int) -> int:
        """The commit timestamp of the transaction of *lock*, a commit of this client,
        if it has committed (its commit point won) above *start_ts*, else 0: a
        transaction started at *start_ts* that writes the locked cell conflicts with
        it, which its prewrite then knows without reading the lock's primary."""
        flight = self._flights.get(lock.start_ts) or self._ended.get(lock.start_ts)
        if flight is not None and flight.committed is True and flight.commit_ts > start_ts:
            return flight.commit_ts
        return 0

    def settle(self, lock: Lock, start_ts: int) -> tuple[int, bool | None] | object:
        """What a read at *start_ts* needs to know of the transaction of *lock*, a
        commit of this client, as its committer tells it, waiting at most
        :data:`SETTLE_WAIT` (and the lock's ttl) until it knows: ``(commit_ts,
        committed)``: committed (True) at *commit_ts*, which the read sees if it is at
        or below *start_ts*; rolled back (False, commit_ts 0); or undecided with its
        commit timestamp drawn above *start_ts* (None, 0), so that the lock hides
        nothing from the read whatever the outcome. Else :data:`ENDED` (the commit
        ended without knowing its outcome: read again) or :data:`UNTOLD` (resolve the
        lock through the store)."""
        until = min(time.monotonic() + SETTLE_WAIT,
                    time.monotonic() + (lock.wall_ms + lock.ttl_ms) / 1000 - time.time())
        with self._changed:
            while True:
                flight = self._flights.get(lock.start_ts)
                ended = flight is None
                if flight is None:
                    flight = self._ended.get(lock.start_ts)
                    if flight is None:
                        return UNTOLD
                if flight.committed is not None:
                    return (flight.commit_ts if flight.committed else 0), flight.committed
                if flight.commit_ts > start_ts:
                    return 0, None
                if ended:
                    return ENDED
                left = until - time.monotonic()
                if left <= 0:
                    return UNTOLD
                self._changed.wait(left)


def roll_back_primary(parts: LockHost, status: TxnStatus) -> bool:
    """The cleaner's decision: CAS X's primary LOCKED -> ROLLED_BACK, then leave a
    ROLLBACK record at X.start_ts and free the cell. False if X moved first."""
    lock, raw = status.pending, status.pending_raw
    assert lock is not None and raw is not None
    table, row, column = lock.primary_table, lock.primary_row, lock.primary_column
    decided = encode_lock(RolledBack(lock.start_ts))
    if not lock_cas(parts.store, table, row, f"{LOCK}:{column}", raw, decided):
        return False
    parts.store.mutate_rows(
        table,
        [Mutation(row, [(f"{WRITE}:{column}", lock.start_ts,
                         encode_write(WriteKind.ROLLBACK, lock.start_ts))])],
    )
    release(parts, table, row, column, decided, lock.start_ts, None)
    log.info("rolled back transaction %d (owner %s)", lock.start_ts, lock.owner)
    return True


def resolve_lock(
    parts: LockHost, table: str, row: bytes, column: str, raw: bytes
) -> bool:
    """Resolve the lock cell value *raw* found at (*table*, *row*, *column*).

    Returns True when the cell was dealt with (or changed under us): read again.
    Returns False when its transaction is alive and within its ttl: wait.
    """
    state = decode_lock(raw)
    if isinstance(state, Free):
        return True
    if isinstance(state, Committed):
        release(parts, table, row, column, raw, state.start_ts,
                (state.commit_ts, state.delete, state.notify), inline=state.value)
        return True
    if isinstance(state, RolledBack):
        release(parts, table, row, column, raw, state.start_ts, None)
        return True
    status = check_txn_status(parts, state)
    if status.pending is not None:
        primary = status.pending
        alive = parts.coordination.is_alive(primary.owner)
        if alive is not False and not _expired(primary):
            return False
        if not roll_back_primary(parts, status):
            return True  # X moved (committed, refreshed or cleaned): look again
        status = TxnStatus(state.start_ts, rolled_back=True)
        parts.stats["locks_resolved"] += 1
        _inc("percolator_locks_resolved_total", "rolled_back")
    if state.is_primary(table, row, column):
        return True  # check_txn_status or roll_back_primary already cleaned it
    if status.commit_ts is not None:
        release(parts, table, row, column, raw, state.start_ts,
                (status.commit_ts, state.delete, state.notify), inline=state.value)
    else:
        release(parts, table, row, column, raw, state.start_ts, None)
    parts.stats["locks_resolved"] += 1
    _inc("percolator_locks_resolved_total",
         "rolled_forward" if status.commit_ts is not None else "rolled_back")
    return True

