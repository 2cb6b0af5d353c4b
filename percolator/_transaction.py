"""The transaction type ladder: ``Snapshot`` (reads) -> ``TransactionBase`` (writes)
-> ``Transaction`` (commit). Observers and loaders receive a ``TransactionBase``:
they read and write; the framework commits and retries for them."""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING

from percolator import metrics as _metrics
from percolator._commit import commit_transaction
from percolator._commit_checks import WriteSet, _CounterByKind
from percolator._encoding import (
    DATA,
    FREE_TAG,
    INLINE_TAG,
    LOCK,
    MAX_ROW_BYTES,
    MAX_VALUE_BYTES,
    USER_COLUMNS,
    WRITE,
    WRITE_RECORD_HEAD,
    Committed,
    Free,
    Lock,
    WriteKind,
    check_column,
    check_row,
    check_value,
    decode_lock,
    decode_write,
    encode_lock,
    encode_write,
    inline_value,
)
from percolator._errors import InvalidArgument, LockedError, TransactionClosedError
from percolator._internals import Internals, internals
from percolator._lock_resolver import ENDED, resolve_lock
from percolator._retry import Attempts
from percolator._store import ATOMICALLY, SET_UNLESS, Cell, Read, RowCells
from percolator.metrics import inc as _inc
from percolator.metrics import observe as _observe

if TYPE_CHECKING:
    from percolator._cluster import Cluster
    from percolator._observer_hooks import Settlement
    from percolator._timestamps import NextStart

__all__ = ["Snapshot", "Transaction", "TransactionBase"]

WriteKey = tuple[str, bytes, str]

_monotonic = time.monotonic
_perf_counter = time.perf_counter

_READS = _metrics.counter("percolator_reads_total")
_BEGUN = _CounterByKind("percolator_transactions_begun_total")
_READ_SAMPLE = _metrics.READ_SAMPLE


def _read_began() -> float:
    """Count a transactional read going to the store, and say when it began if it is
    one of those timed into the read-duration histogram (the first, then one in
    ``READ_SAMPLE``: see :data:`percolator.metrics.READ_SAMPLE`), else 0.0: two clock
    reads and an observation per read cost more than every other metric of a read."""
    if _metrics._enabled and next(_READS) % _READ_SAMPLE == 1:
        return _perf_counter()
    return 0.0

_LOCK_PREFIX, _WRITE_PREFIX, _DATA_PREFIX = f"{LOCK}:", f"{WRITE}:", f"{DATA}:"
_ROLLBACK_TAG = WriteKind.ROLLBACK.value


def _check_bound(name: str, value: object) -> bytes | None:
    if value is not None and not isinstance(value, bytes):
        raise InvalidArgument(
            f"{name} must be bytes or None, got {type(value).__name__}: {value!r}"
        )
    return value


def _check_columns(columns: object, *, internal: bool) -> list[str]:
    if isinstance(columns, str | bytes) or not isinstance(columns, Iterable):
        raise InvalidArgument(
            f"columns must be a list of 'family:qualifier' strings, got {columns!r:.80}"
        )
    return [check_column(c, internal=internal) for c in columns]


_SEEN_MAX = 4096
"""Cells a snapshot remembers having read (beyond it, reads go to the store again)."""
PREDICTED_MAX = 16
"""Columns a cluster predicts, at most, after a row's first read column."""


class Snapshot:
    """Consistent reads at :attr:`start_ts`: every read sees exactly the transactions
    that committed before it (Percolator's snapshot isolation).

    The start timestamp is drawn when the snapshot is made, or given as *start_ts* (an
    earlier snapshot's, to read the same state again). Reads block on (and resolve)
    locks of older transactions; they wait at most the cluster's lock wait (seconds,
    ``connect(lock_wait=...)``), then raise :class:`LockedError`.

    Close it when done: until :meth:`close` (or the end of its ``with`` block, or until
    nothing references it) it holds garbage collection's safe point at its start
    timestamp. One that falls below the safe point anyway raises
    :class:`SnapshotTooOldError` at its next read. A snapshot is for one thread at a
    time; make one per thread (they are cheap: one timestamp).

    ::

        with percolator.Snapshot(cluster) as snap:
            html = snap.get("documents", b"https://a.example/", "raw:html")

    :raises InvalidArgument: when *cluster* is not a :class:`Cluster`.
    :raises SnapshotTooOldError: when *start_ts* is below the safe point.
    :raises OracleUnavailable: when the cluster's timestamp oracle gives no timestamp.
    :raises StoreUnavailable: when the store gives none: a cluster without an oracle
        draws its timestamps from the store (SQLite, HBase, Bigtable), so an HBase
        that does not answer fails here with the store's error, not the oracle's.
    """

    _internal_columns = False
    _writable = False
    """Whether instances buffer writes (:class:`TransactionBase`): its start's part."""
    _kind: str
    """The ``kind`` label of a transaction's metrics (:class:`TransactionBase`)."""
    _stop_waiting: threading.Event | None = None
    """Set by whoever runs the transaction (a worker) to cut lock waits short when it
    stops: the read then raises :class:`LockedError` at once."""
    _read_state: dict[WriteKey, tuple[bytes | None, list[Cell]]] | None = None
    """What a transaction's reads saw of each cell read, for its prewrite: the lock
    value (FREE ones too) and the write records at or after start_ts (None: not kept;
    see :meth:`_remember`)."""

    def __init__(self, cluster: Cluster, *, start_ts: int | None = None) -> None:
        # A Cluster is what holds its own Internals (this module does not import
        # percolator._cluster, which imports it to make transactions).
        parts = getattr(cluster, "_internals", None)
        if type(parts) is not Internals or parts.cluster is not cluster:
            raise InvalidArgument(
                f"a transaction needs a percolator.Cluster, got {type(cluster).__name__}"
            )
        if cluster._closed:
            cluster._check_open()
        self.cluster = cluster
        self._parts = parts
        self._closed = False
        self._began = time.time()
        self._safe_point = self._parts.safe_point
        self.start_ts: int
        if start_ts is None:
            self._begin()
        else:
            self._safe_point.check(start_ts, self._what)
            self.start_ts = start_ts
            self._safe_point.register(self)
        if self._writable:
            # TransactionBase's part, here rather than in an __init__ of its own: every
            # transaction starts, and this spares each a call. Counted once the start
            # timestamp is drawn: a start whose draw failed began nothing.
            if _metrics._enabled:
                next(_BEGUN[self._kind])
            self._writes = {}
            self._weak: dict[WriteKey, None] = {}
            self.commit_ts: int | None = None
            # Kept where the prewrite reads a cell's lock and write records before its
            # compare-and-set (not where the store tests the conflict conditions
            # itself, nor where it may leave a FREE lock as it was: there the prewrite
            # reads again after locking), and there are locks to read at all.
            capabilities = parts.store.capabilities
            if (parts.lock_census is None and SET_UNLESS not in capabilities
                    and ATOMICALLY not in capabilities):
                self._read_state = {}
        self._read_cache: dict[tuple[tuple[str, ...] | None, bool], list[Read]] = {}
        self._seen: dict[WriteKey, bytes | None] = {}
        """Cells this snapshot has read (``get``/``get_row``): the state at start_ts is
        fixed once a read has waited out the locks below it, so a second read of a
        cell needs no store call (an observer reading the column it was woken for)."""
        self._first_read: dict[tuple[str, bytes], str] = {}
        """The first column this snapshot read of each row: the key of the cluster's
        read predictions (:meth:`_predicted`)."""

    # --- validation ---------------------------------------------------------------

    def _check_safe_point(self) -> None:
        """After every store read (never before it: see :mod:`percolator._safe_point`),
        make sure that garbage collection cannot have removed what the read needed."""
        sp = self._safe_point
        # SafePoint.check inlined for the fast path: fresh cache, start_ts not below.
        if _monotonic() - sp._fetched > sp.refresh or self.start_ts < sp._value:
            sp.check(self.start_ts, self._what)

    def _draw_start(self) -> int:
        """Draw :attr:`start_ts` now, and hold the safe point at it."""
        return self._safe_point.begin(self, self._parts.timestamps.get_timestamp)

    def _begin(self) -> None:
        """How a snapshot made without a start timestamp gets one (a
        :class:`Transaction` may hold a spare instead)."""
        self._draw_start()

    @property
    def _what(self) -> str:
        """What it is called in messages."""
        return "transaction" if self._writable else "snapshot"

    def _label(self) -> str:
        # Not self.start_ts: a transaction that has not drawn it yet would draw it.
        return str(self.__dict__.get("start_ts", "(not started)"))

    def _check_open(self) -> None:
        if self._closed:
            if self._writable:
                raise TransactionClosedError(
                    f"transaction {self._label()} is already closed (committed, rolled back "
                    "or closed); start a new one"
                )
            raise TransactionClosedError(
                f"snapshot {self._label()} is already closed; open a new one "
                "(percolator.Snapshot(cluster), or Snapshot(cluster, start_ts) to read "
                "the same state again)"
            )

    def _check_cell(self, table: str, row: bytes, column: str) -> None:
        # The checks of every get and set: the usual case answered in line (get tests
        # the same usual case before calling: keep the two in step).
        if self._closed:
            self._check_open()
        if table not in self.cluster._tables:
            self._parts.require_table(table)
        if type(row) is not bytes or not row or len(row) > MAX_ROW_BYTES:
            check_row(row)
        if type(column) is not str or column not in USER_COLUMNS:  # unhashable: TypeError
            check_column(column, internal=self._internal_columns)

    # --- store reads ----------------------------------------------------------------

    def _reads(self, columns: Sequence[str] | None) -> list[Read]:
        qualifiers = None if columns is None else tuple(columns)
        census = self._parts.lock_census
        # Asked after start_ts was drawn, as the census requires.
        no_locks = census is not None and census.clean()
        if census is not None and not no_locks:
            self._parts.sweep_locks()  # rate limited
        reads = self._read_cache.get((qualifiers, no_locks))
        if reads is None:
            # No data cells: a write record carries its value, except one written by
            # lock resolution or for a large value, whose data :meth:`_values` reads.
            # No FREE locks (nothing to wait for), and no lock family at all when
            # the lock census says that no lock can be held.
            reads = [Read(WRITE, qualifiers, max_ts=self.start_ts)]
            if self._read_state is not None:
                # A transaction's reads bring what its prewrite would read (see
                # _remember): the lock whatever its state, and the newest write record
                # after start_ts, which the store's row read (the newest of each
                # column, at any time, then an older one where that is newer than
                # start_ts) finds anyway.
                reads = [Read(LOCK, qualifiers), reads[0],
                         Read(WRITE, qualifiers, min_ts=self.start_ts + 1)]
            elif not no_locks:
                reads.insert(0, Read(LOCK, qualifiers, skip_tag=FREE_TAG))
            if len(self._read_cache) < 64:
                self._read_cache[(qualifiers, no_locks)] = reads
        return reads

    def _blocking(self, cells: RowCells) -> list[tuple[str, bytes]]:
        """Lock cells that hide a change at or below start_ts."""
        found = []
        for name, versions in cells.items():
            if name[:2] != _LOCK_PREFIX or versions[0][1][:1] == FREE_TAG:
                continue
            state = decode_lock(versions[0][1])
            if (isinstance(state, Lock) and state.start_ts <= self.start_ts) or (
                isinstance(state, Committed) and state.commit_ts <= self.start_ts
            ):
                found.append((name[2:], versions[0][1]))
        return found

    def _remember(self, table: str, row: bytes, cells: RowCells,
                  columns: Iterable[str] | None) -> None:
        """A transaction's row read, lock-free at start_ts, made visible: write records
        after start_ts (the prewrite's part of the read, :meth:`_reads`) leave *cells*,
        and what the read saw of each of *columns* (every column in *cells* if None) is
        kept for the prewrite (:attr:`_read_state`): its lock value and its write
        records at or after start_ts.

        The prewrite sets each lock from the value kept here, by compare-and-set: that
        succeeds only if the lock cell did not change since this read (FREE values are
        never written twice), and so no write record appeared since either (DESIGN.md
        section 5, invariant A). A read made any time after start_ts is then as good as
        the prewrite's own, which this spares: a transfer that read its two rows makes
        one store call fewer. A change committed after start_ts is seen here already,
        and the commit gives up before taking any lock."""
        start = self.start_ts
        state = self._read_state
        assert state is not None
        names = set() if columns is None else set(columns)
        since: dict[str, list[Cell]] = {}
        for name in list(cells):
            prefix = name[:2]
            if prefix == _WRITE_PREFIX:
                versions = cells[name]
                if versions[0][0] >= start:
                    since[name[2:]] = [c for c in versions if c[0] >= start]
                    if versions[0][0] > start:
                        visible = [c for c in versions if c[0] <= start]
                        if visible:
                            cells[name] = visible
                        else:
                            del cells[name]
                if columns is None:
                    names.add(name[2:])
            elif columns is None and prefix == _LOCK_PREFIX:
                names.add(name[2:])
        if len(state) >= _SEEN_MAX:
            return
        for column in names:
            writes = since.get(column, [])
            if writes and writes[0][0] > start and writes[0][1][:1] == _ROLLBACK_TAG:
                continue  # it may hide an older commit after start_ts: the prewrite reads
            lock = cells.get(_LOCK_PREFIX + column)
            state[(table, row, column)] = (lock[0][1] if lock else None, writes)

    def _settled(self, cells: RowCells, blocked: list[tuple[str, bytes]],
                 read_again: set[int]) -> list[tuple[str, bytes]] | None:
        """The *blocked* locks whose commits this client's own committers cannot tell
        about (:class:`~percolator._lock_resolver.CommitsInFlight`), after waiting for
        those that can: a lock whose transaction commits after start_ts, or not at all,
        hides nothing; one committed at or below it is read as the write record its
        commit writes, put in *cells*. A lock whose outcome is known is kept (for the
        prewrite, :meth:`_remember`) as the FREE value its release writes, with the
        write record of a commit after start_ts (a conflict, which the read saw only
        as the lock): a compare-and-set from that FREE value succeeds once the lock is
        released, and only if nothing took the cell since (FREE values are never
        written twice). None: read the row again (a commit that ended not knowing its
        outcome; once per commit, in *read_again*)."""
        in_flight = self._parts.in_flight
        left: list[tuple[str, bytes]] = []
        again = False
        for column, raw in blocked:
            lock = decode_lock(raw)
            if not isinstance(lock, Lock):
                left.append((column, raw))
                continue
            told = in_flight.settle(lock, self.start_ts)
            if type(told) is tuple:
                commit_ts, committed = told
                if committed is None or (
                        commit_ts > self.start_ts and self._read_state is None):
                    continue  # nothing of it at or below start_ts; the lock as read
                if commit_ts:
                    # Its write record: seen if at or below start_ts; above it, kept
                    # by _remember for the prewrite (a conflict) and left unseen.
                    name = _WRITE_PREFIX + column
                    kind = WriteKind.DELETE if lock.delete else WriteKind.PUT
                    cells[name] = sorted(
                        [(commit_ts, encode_write(kind, lock.start_ts, lock.value)),
                         *cells.get(name, ())], reverse=True)
                cells[_LOCK_PREFIX + column] = [
                    (0, encode_lock(Free(lock.start_ts, committed)))]
            elif told is ENDED and lock.start_ts not in read_again:
                read_again.add(lock.start_ts)
                again = True
            else:
                left.append((column, raw))
        return None if again else left

    def _wait_for_locks(
        self, table: str, row: bytes, blocked: list[tuple[str, bytes]], attempts: Attempts | None
    ) -> Attempts | None:
        """Resolve what can be resolved; when nothing moved, wait (per the cluster's
        lock wait policy) for the live holders, or raise LockedError past its deadline."""
        progressed = False
        _inc("percolator_locks_met_total", amount=len(blocked))
        for column, raw in blocked:
            if resolve_lock(internals(self.cluster), table, row, column, raw):
                progressed = True
        if progressed:
            return attempts
        if attempts is None:
            attempts = self._parts.lock_wait_policy.attempts(self._stop_waiting)
        waited = time.monotonic()
        done_waiting = not attempts.wait()
        _inc("percolator_lock_wait_seconds_total", amount=time.monotonic() - waited)
        if done_waiting:
            column, raw = blocked[0]
            lock = decode_lock(raw)
            holder = getattr(lock, "start_ts", "?")
            raise LockedError(
                f"{table}/{row!r}/{column} is locked by transaction {holder}"
                f" (owner {getattr(lock, 'owner', '?')}), still alive after waiting "
                f"{attempts.elapsed():.1f}s; retry later",
                table=table, row=row, column=column, lock_ts=getattr(lock, "start_ts", 0),
            )
        return attempts

    def _read_row(self, table: str, row: bytes, columns: Sequence[str] | None) -> dict[str, bytes]:
        return self._read_row_with(table, row, columns, ())[0]

    def _read_row_with(
        self, table: str, row: bytes, columns: Sequence[str] | None, extra: Sequence[str]
    ) -> tuple[dict[str, bytes], frozenset[str]]:
        """Read *columns* of *row*, and in the same store call the *extra* columns a
        prediction expects to be read next; return the values and the extra columns
        left unread. A lock on an extra column is not waited for: that column is left
        out (read when asked for), so a wrong prediction never makes a read wait."""
        attempts: Attempts | None = None
        store = self._parts.store
        wanted = columns if not extra or columns is None else [*columns, *extra]
        reads = self._reads(wanted)
        read_again: set[int] = set()
        began = _read_began()
        while True:
            cells = store.read_rows(table, [row], reads).get(row)
            if not cells:
                if self._read_state is not None:
                    self._remember(table, row, {}, wanted or ())
                if began:
                    _observe("percolator_read_duration_seconds", _perf_counter() - began)
                self._check_safe_point()
                return {}, frozenset()
            # The lock read comes first when there is one (an observer run's notify
            # read may follow the write records).
            blocked = self._blocking(cells) if reads[0].family == LOCK else None
            left_out: frozenset[str] = frozenset()
            if blocked and extra:
                asked = [b for b in blocked if b[0] not in extra]
                if not asked:
                    left_out = frozenset(b[0] for b in blocked)
                    cells = {n: v for n, v in cells.items() if n[2:] not in left_out}
                blocked = asked
            if blocked and self._parts.in_flight.watched:
                settled = self._settled(cells, blocked, read_again)
                if settled is None:
                    continue
                blocked = settled
            if not blocked:
                if self._read_state is not None:
                    self._remember(table, row, cells, None if wanted is None else
                                   [c for c in wanted if c not in left_out])
                values = self._values(table, row, cells)
                if began:
                    _observe("percolator_read_duration_seconds", _perf_counter() - began)
                self._check_safe_point()
                return values, left_out
            attempts = self._wait_for_locks(table, row, blocked, attempts)

    def _predicted(self, table: str, row: bytes, column: str) -> list[str]:
        """Columns of *row* that transactions which first read *column* of a row of
        *table* went on to read there (Percolator §2.5: reads prefetched by
        prediction), less those this snapshot knows already."""
        learned = self._parts.read_predictions.get((table, column))
        if not learned:
            return []
        writes, seen = self._writes, self._seen
        return [c for c in learned
                if (table, row, c) not in seen and (table, row, c) not in writes]

    def _learn(self, table: str, row: bytes, column: str) -> None:
        """Note that *column* is read in *row*: after the row's first column, it joins
        that column's predictions (at most PREDICTED_MAX columns)."""
        first = self._first_read.setdefault((table, row), column)
        if first == column:
            return
        predictions = self._parts.read_predictions
        learned = predictions.get((table, first), ())
        if column not in learned and len(learned) < PREDICTED_MAX:
            predictions[(table, first)] = (*learned, column)

    def _values(self, table: str, row: bytes, cells: RowCells) -> dict[str, bytes]:
        """Decode the visible values from a row read (lock-free at start_ts)."""
        values: dict[str, bytes] = {}
        pointers: list[Read] = []
        for name, writes in cells.items():
            if name[:2] != _WRITE_PREFIX:
                continue
            column = name[2:]
            if not self._internal_columns and column[:1] == "_":
                continue
            record = writes[0][1]
            if record[:1] == _ROLLBACK_TAG:
                found = self._newest_write(table, row, column)
                if found is None:
                    continue
                record = found
            value = inline_value(record)
            if value is not None:
                values[column] = value
                continue
            kind, data_ts = decode_write(record)
            if kind is WriteKind.PUT:
                pointers.append(Read(DATA, (column,), min_ts=data_ts, max_ts=data_ts))
        if pointers:
            data = self._parts.store.read_rows(table, [row], pointers).get(row, {})
            for read in pointers:
                assert read.qualifiers is not None
                column = read.qualifiers[0]
                versions = data.get(_DATA_PREFIX + column)
                if versions:
                    values[column] = versions[0][1]
        return values

    def _newest_write(self, table: str, row: bytes, column: str) -> bytes | None:
        """The newest PUT/DELETE record at or below start_ts, skipping ROLLBACK records."""
        cells = self._parts.store.read_rows(
            table, [row], [Read(WRITE, (column,), max_ts=self.start_ts, versions=None)]
        )
        for _, record in cells.get(row, {}).get(f"{WRITE}:{column}", []):
            if record[:1] != _ROLLBACK_TAG:
                return record
        return None

    # --- public reads ---------------------------------------------------------------

    _writes: Mapping[WriteKey, bytes | None] = MappingProxyType({})
    """The transaction's own buffered writes, which its reads see (none in a snapshot)."""

    def get(self, table: str, row: bytes, column: str) -> bytes | None:
        """The value of (*table*, *row*, *column*) in this snapshot, or None.

        .. warning:: blocks while an older transaction holds a lock on the cell.
        :raises LockedError: when that lock outlives the cluster's lock wait (seconds).
        :raises UnknownTableError: when *table* does not exist.
        :raises InvalidArgument: for a row that is not non-empty bytes, or a column that
            is not ``"family:qualifier"``.
        :raises SnapshotTooOldError: when garbage collection passed the start timestamp.
        :raises TransactionClosedError: after :meth:`close` (or commit, or rollback).
        """
        # _check_cell's usual case, tested here without its call (most reads pass every
        # check): anything else goes to it, which raises or accepts (an internal column).
        if (self._closed or table not in self.cluster._tables or type(row) is not bytes
                or not row or len(row) > MAX_ROW_BYTES or type(column) is not str
                or column not in USER_COLUMNS):
            self._check_cell(table, row, column)
        key = (table, row, column)
        first = self._first_read.setdefault((table, row), column)
        if first is not column and first != column:
            self._learn(table, row, column)
        writes = self._writes
        if writes and key in writes:  # a snapshot's, and most transactions', are empty
            return writes[key]
        seen = self._seen
        if key in seen:
            self._check_safe_point()  # a snapshot GC overtook reads nothing more
            return seen[key]
        parts = self._parts
        predictions = parts.read_predictions  # empty until a row's second column is read
        extra = (self._predicted(table, row, column)
                 if predictions and (table, column) in predictions else ())
        census = parts.lock_census
        if not extra and census is not None and census.flag[0] == 0:  # census.clean()
            # No lock can be held (the census is clean, asked after start_ts was drawn)
            # and no prediction rides along: the write record alone, no lock to wait
            # for; the same answer as _read_row_with's in fewer steps, here in line
            # (with _read_began, inline_value and _check_safe_point) because most
            # reads are these.
            if _metrics._enabled and next(_READS) % _READ_SAMPLE == 1:
                began = _perf_counter()
            else:
                began = 0.0
            # The census exists over an embedded file only (EMBEDDED_FILE: newest_at).
            found = parts.store.newest_at(  # type: ignore[attr-defined]
                table, row, WRITE, column, self.start_ts)
            value = None
            if found is not None:
                record = found[1]
                if record[:1] == INLINE_TAG:  # inline_value, in line
                    value = record[WRITE_RECORD_HEAD:]
                else:  # a rollback record, a deletion or a data pointer
                    value = self._values(table, row, {_WRITE_PREFIX + column: [found]}).get(
                        column)
            if began:
                _observe("percolator_read_duration_seconds", _perf_counter() - began)
            sp = self._safe_point
            if _monotonic() - sp._fetched > sp.refresh or self.start_ts < sp._value:
                sp.check(self.start_ts, self._what)
        else:
            found_row, left_out = self._read_row_with(table, row, (column,), extra)
            value = found_row.get(column)
            if len(seen) < _SEEN_MAX:
                for other in extra:
                    if other not in left_out:
                        seen[(table, row, other)] = found_row.get(other)
        if len(seen) < _SEEN_MAX:
            seen[key] = value
        return value

    def get_row(self, table: str, row: bytes, columns: Sequence[str]) -> dict[str, bytes]:
        """The present values among *columns* of one row, in one store read: a column
        with no value is left out of the result. Blocks and raises as :meth:`get`."""
        self._check_open()
        self._parts.require_table(table)
        check_row(row)
        wanted = _check_columns(columns, internal=self._internal_columns)
        result: dict[str, bytes] = {}
        missing = []
        writes, seen = self._writes, self._seen
        for column in wanted:
            self._learn(table, row, column)
            key = (table, row, column)
            if key in writes:
                value = writes[key]
            elif key in seen:
                self._check_safe_point()
                value = seen[key]
            else:
                missing.append(column)
                continue
            if value is not None:
                result[column] = value
        if missing:
            first = self._first_read[(table, row)]
            extra = [c for c in self._predicted(table, row, first) if c not in missing]
            found, left_out = self._read_row_with(table, row, missing, extra)
            result.update((c, found[c]) for c in missing if c in found)
            if len(seen) < _SEEN_MAX:
                for column in missing:
                    seen[(table, row, column)] = found.get(column)
                for column in extra:
                    if column not in left_out:
                        seen[(table, row, column)] = found.get(column)
        return result

    def get_rows(
        self, table: str, rows: Iterable[bytes], columns: Sequence[str]
    ) -> dict[bytes, dict[str, bytes]]:
        """The present values among *columns* of each of *rows*, in one store read
        (plus one per row that meets a lock, as :meth:`get_row`; on the embedded
        store, while no lock can be held, as :meth:`get` of each cell, which costs
        less there). Every requested row is a key of the result; a row with none of
        the columns maps to ``{}``. Blocks and raises as :meth:`get`."""
        self._check_open()
        self._parts.require_table(table)
        wanted = _check_columns(columns, internal=self._internal_columns)
        if isinstance(rows, bytes | str):
            raise InvalidArgument(f"rows must be an iterable of bytes rows, got {rows!r:.80}")
        result: dict[bytes, dict[str, bytes]] = {}
        to_read: dict[bytes, list[str]] = {}
        writes = self._writes
        for row in rows:
            check_row(row)
            if row in result:
                continue
            values = result[row] = {}
            for column in wanted:
                key = (table, row, column)
                if key not in writes:
                    to_read.setdefault(row, []).append(column)
                elif (value := writes[key]) is not None:
                    values[column] = value
        if not to_read:
            return result
        census = self._parts.lock_census
        if census is not None and census.flag[0] == 0:
            # The embedded store while no lock can be held: get's one index probe per
            # cell costs half of one statement over every row (bench/overhead.py,
            # "rows read together"), and there is no round trip to save.
            for row, columns_left in to_read.items():
                own = result[row]
                for column in columns_left:
                    value = self.get(table, row, column)
                    if value is not None:
                        own[column] = value
            return result
        # One read of the union of the columns still missing; a row whose own
        # writes cover some of them must not see the stored values of those.
        missing = [c for c in wanted if any(c in cols for cols in to_read.values())]
        began = _read_began()
        stored = self._parts.store.read_rows(table, list(to_read), self._reads(missing))
        for row, columns_left in to_read.items():
            cells = stored.get(row)
            if not cells:
                if self._read_state is not None:
                    self._remember(table, row, {}, missing)
                continue
            if self._blocking(cells):
                found = self._read_row(table, row, columns_left)
            else:
                if self._read_state is not None:
                    self._remember(table, row, cells, missing)
                found = self._values(table, row, cells)
            own = result[row]
            for column in columns_left:
                if column in found:
                    own[column] = found[column]
        if began:
            _observe("percolator_read_duration_seconds", _perf_counter() - began)
        self._check_safe_point()
        return result

    def scan(
        self,
        table: str,
        start: bytes | None = None,
        stop: bytes | None = None,
        columns: Sequence[str] | None = None,
    ) -> Iterator[tuple[bytes, dict[str, bytes]]]:
        """Rows in ``[start, stop)`` in row order with their visible *columns* (all
        user columns when None); rows with none of them are skipped. *start* and *stop*
        are row keys (None: the table's first, or past its last). The rows are read from
        the store as the iteration goes, all at the snapshot's timestamp; a row that
        meets a lock blocks and raises as :meth:`get`.

        ::

            with percolator.Snapshot(cluster) as snap:
                for row, cells in snap.scan("documents", b"https://a.", b"https://b.",
                                            ["raw:html"]):
                    print(row, len(cells["raw:html"]))
        """
        self._check_open()
        self._parts.require_table(table)
        _check_bound("start", start)
        _check_bound("stop", stop)
        wanted = None if columns is None else _check_columns(
            columns, internal=self._internal_columns
        )
        return self._scan(table, start, stop, wanted)

    def _scan(
        self, table: str, start: bytes | None, stop: bytes | None, columns: list[str] | None
    ) -> Iterator[tuple[bytes, dict[str, bytes]]]:
        stored = self._parts.store.scan(table, start, stop, self._reads(columns))
        for row, cells in stored:
            if self._blocking(cells):
                values = self._read_row(table, row, columns)
            else:
                if self._read_state is not None:
                    self._remember(table, row, cells, columns)
                values = self._values(table, row, cells)
                self._check_safe_point()
            if values:
                yield row, values
        self._check_safe_point()  # rows that GC may have removed are simply not there

    # --- life cycle -------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Read nothing more, and stop holding garbage collection back now (an open
        snapshot holds the safe point at its start timestamp while it is referenced).
        Idempotent. A snapshot is also a context manager that closes it."""
        self._closed = True

    def __enter__(self) -> Snapshot:
        self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<percolator.{type(self).__name__} start_ts={self._label()} {state}>"


class TransactionBase(Snapshot):
    """Reads plus buffered writes. Writes are seen by later reads of the same
    transaction and reach the store only at commit."""

    _writable = True
    _kind = "user"
    """The ``kind`` label of this transaction's metrics."""
    _writes: dict[WriteKey, bytes | None]  # made by Snapshot.__init__, as _weak and commit_ts
    _settlement: Settlement | None = None
    """The notification an observer run's commit serves (:mod:`percolator._observer_hooks`)."""
    _next_start: NextStart | None = None
    """Where an observer run's two-phase commit leaves a start timestamp drawn with its
    commit timestamp (:mod:`percolator._observer_hooks`)."""

    # No __init__ of its own: Snapshot.__init__ starts it (see _writable there).

    def set(self, table: str, row: bytes, column: str, value: bytes) -> None:
        """Write *value* to the cell at commit (buffered until then; later reads of
        this transaction see it).

        :raises ValueTooLargeError: when *value* is over 4 MiB (:data:`MAX_VALUE_BYTES`)
            or *row* over 4 KiB.
        :raises InvalidArgument: when *value* is not bytes, or for a bad row or column
            (as :meth:`get`); families starting with ``_`` are reserved.
        :raises UnknownTableError: when *table* does not exist.
        """
        self._check_cell(table, row, column)
        if type(value) is not bytes or len(value) > MAX_VALUE_BYTES:  # usual: in line
            value = check_value(value)
        self._writes[(table, row, column)] = value

    def delete(self, table: str, row: bytes, column: str) -> None:
        """Delete the cell at commit (later reads of this transaction see None).
        Raises as :meth:`set`."""
        self._check_cell(table, row, column)
        self._writes[(table, row, column)] = None

    def notify(self, table: str, row: bytes, column: str) -> None:
        """A weak notification: at commit, mark the cell dirty for its observer
        without writing it (no conflicts, no acknowledgement check)."""
        self._check_cell(table, row, column)
        self._weak[(table, row, column)] = None

    @property
    def writes(self) -> dict[WriteKey, bytes | None]:
        """The buffered writes (value None: a delete), in the order first written."""
        return dict(self._writes)

    def _write_set(self) -> WriteSet:
        """Close the transaction and hand its commit what it wrote, once per commit
        attempt (a commit that starts over hands it over again): the commit reads
        nothing else of it (:class:`~percolator._commit_checks.WriteSet`)."""
        self._closed = True
        return WriteSet(self, self.cluster, self._parts, self._kind, self._writes, self._weak,
                        self._settlement, self._next_start, self._read_state)

    def _scan(
        self, table: str, start: bytes | None, stop: bytes | None, columns: list[str] | None
    ) -> Iterator[tuple[bytes, dict[str, bytes]]]:
        own: dict[bytes, dict[str, bytes | None]] = {}
        for (t, row, column), value in self._writes.items():
            if t != table or (start is not None and row < start) or (stop and row >= stop):
                continue
            if columns is not None and column not in columns:
                continue
            if column.startswith("_") and not self._internal_columns:
                continue
            own.setdefault(row, {})[column] = value
        if not own:
            yield from super()._scan(table, start, stop, columns)
            return
        stored = super()._scan(table, start, stop, columns)
        pending: list[tuple[bytes, dict[str, bytes]]] = [(row, {}) for row in sorted(own)]
        for row, values in _merge_rows(stored, pending):
            merged = dict(values)
            for column, value in own.get(row, {}).items():
                if value is None:
                    merged.pop(column, None)
                else:
                    merged[column] = value
            if merged:
                yield row, merged


def _merge_rows(
    a: Iterable[tuple[bytes, dict[str, bytes]]], b: Iterable[tuple[bytes, dict[str, bytes]]]
) -> Iterator[tuple[bytes, dict[str, bytes]]]:
    """Merge two row-ordered streams, joining rows present in both."""
    previous: tuple[bytes, dict[str, bytes]] | None = None
    for row, values in heapq.merge(a, b, key=lambda item: item[0]):
        if previous is not None and previous[0] == row:
            previous = (row, {**values, **previous[1]})
            continue
        if previous is not None:
            yield previous
        previous = (row, values)
    if previous is not None:
        yield previous


class _StartOnFirstUse:
    """:attr:`Transaction.start_ts` while a spare is held (the instance has no
    ``start_ts`` of its own yet: a descriptor without ``__set__`` is asked only then):
    the first read, or the application asking, takes the snapshot now, above every
    commit that returned before the transaction was created; a read at the spare could
    miss one made since the spare was drawn.

    A descriptor of this one name, not ``__getattr__``: a class with ``__getattr__``
    leaves every attribute load of its instances unspecialized by CPython, four times
    the cost of a plain one, a dozen of them in each read."""

    def __get__(self, txn: Transaction | None, owner: type | None = None) -> int:
        if txn is None or not txn._spare:
            raise AttributeError(
                f"{(owner or type(txn)).__name__!r} object has no attribute 'start_ts'")
        start_ts = txn._draw_start()
        txn._spare = 0  # after the draw: one that failed is tried again
        return start_ts


class Transaction(TransactionBase):
    """A snapshot-isolation transaction over any number of rows and tables.

    Reads see the snapshot at :attr:`start_ts` and the transaction's own writes;
    writes are buffered and reach the store at :meth:`commit`, all or nothing. The
    snapshot holds every transaction that committed before this one was created, and
    is taken no later than its first read: when it is created, or, on the cluster
    stores (Bigtable, HBase) after a commit of the same thread in the last second, at
    its first read or when :attr:`start_ts` is first asked for (as FoundationDB takes
    its read version and PostgreSQL its snapshot), so it may also hold commits made
    in between. Such a transaction holds a timestamp that commit drew with its own: if
    it reads nothing it commits at that one, a round trip fewer, and where that meets
    a commit made since, again at a fresh one (docs/timestamps.md, "A transaction that
    only writes"). Ask for :attr:`start_ts` to take the snapshot at once. As a context
    manager it commits on a clean exit and rolls back on an exception::

        with percolator.Transaction(cluster) as txn:
            txn.set("accounts", b"alice", "bal:amount", b"90")

    A conflict at commit raises :class:`ConflictError`: run the whole transaction
    again on a fresh snapshot, which :func:`transactional` does for you. A transaction
    is for one thread at a time; many transactions may run at once, in any threads and
    processes. Methods of a committed or rolled-back transaction raise
    :class:`TransactionClosedError`.

    Creating one draws its start timestamp (or a spare, above), from the cluster's
    oracle if it has one (:class:`OracleUnavailable` when that fails) and otherwise
    from the store (:class:`StoreUnavailable` when that fails: an HBase without an
    oracle that does not answer).
    """

    _spare = 0
    """A start timestamp drawn with this thread's previous commit (the cluster stores),
    held instead of drawing one: the transaction commits at it if it reads nothing,
    and draws its own at its first read (0: none; :attr:`start_ts` is set)."""

    def _begin(self) -> None:
        if self._parts.lock_census is not None:  # the embedded store: a draw is local
            self._draw_start()
            return
        spares = self._parts.spare_starts.next
        self._next_start = spares  # this commit leaves the thread's next one a spare
        self._spare = spares.take(self._safe_point._value)
        if not self._spare:
            self._draw_start()

    if not TYPE_CHECKING:  # for mypy, start_ts is a plain attribute
        start_ts = _StartOnFirstUse()

    def commit(self) -> int:
        """Commit the buffered writes (Percolator's two-phase commit); returns the
        commit timestamp (the start timestamp for a transaction with no writes).

        :raises ConflictError: another transaction wrote or locked a cell we write;
            nothing of this transaction remains.
        :raises CommitUnknownError: the store failed at the commit point itself.
        """
        if self._closed:
            self._check_open()
        if not self._spare:
            return commit_transaction(self)
        # It read nothing: it commits as a transaction begun when the spare was drawn,
        # that waited until now, would (docs/timestamps.md).
        self.start_ts, self._spare = self._spare, 0
        self._safe_point.register(self)
        return commit_transaction(self, again=self._start_over)

    def _start_over(self) -> None:
        # A commit made since the spare was drawn (maybe before this transaction was
        # made, by another client), or the safe point overtaking the spare: nothing of
        # it committed, and having read nothing it starts over at a fresh draw, as if
        # begun now (docs/timestamps.md). It stays closed, as its first attempt left it
        # (the commit hands it over again at once): a draw that fails leaves it as any
        # failed commit does, not open at the spare, whose reads would miss commits
        # that returned before it was made.
        self._draw_start()

    def rollback(self) -> None:
        """Discard the buffered writes. Idempotent; a no-op after commit."""
        self._closed = True
        self._writes.clear()
        self._weak.clear()

    close = rollback

    def __enter__(self) -> Transaction:
        if self._closed:
            self._check_open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None and not self._closed:
            self.commit()
        else:
            self.rollback()
