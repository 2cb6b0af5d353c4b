"""Commit: Percolator's two-phase commit, or one atomic step where the store allows.

Two-phase commit (every store), store round trips for a transaction writing N cells:

* prewrite: one batched read of lock + newer write records per table, then one
  compare-and-set per cell (carrying its data where the store is atomic per row);
  where the store offers ``set_unless`` (Bigtable), one conditional mutation per cell
  instead, whose guards are the conflict conditions themselves, and no read (a cell
  whose guards match is then read to learn why); the cells in the primary's row are
  locked together, in one such mutation whose guards are all of theirs;
* commit: one timestamp, the commit point (one CAS of the primary, carrying its
  write record on atomic stores, and there also the write records and FREE locks of
  the secondaries in its row: invariant A makes them ours to write until the
  primary is decided, and this CAS decides it), then one CAS per other secondary
  (non-atomic stores: one batched write of all write records first).

A single-cell transaction on Bigtable: 2 conditional mutations + 2 timestamps (one
``increment`` each without an oracle); so is a transaction of any number of cells in
one row (an observer's output and acknowledgement). A lock-free one-phase commit is
not possible there: its commit timestamp is drawn before its one mutation lands, and a
reader whose start timestamp is above it, reading before it lands, finds neither a
lock nor a record (TiKV's one-phase commit relies on the store tracking the newest
read timestamp, ``max_ts``, which Bigtable and HBase do not).

One-phase commit (the embedded store, see :func:`_commit_one_phase`): one read per row and
one write per table inside one SQLite write transaction, plus the two timestamps, for any N;
only the writes and the COMMIT hold back start timestamps drawn meanwhile.

Write records of a put carry the value (up to ``INLINE_MAX_BYTES`` in a two-phase
commit, always in a one-phase one), so a read needs the lock and the record only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from percolator import metrics as _metrics
from percolator._cas import lock_cas
from percolator._encoding import (
    DATA,
    FREE_TAG,
    LOCK,
    NOTIFY,
    WRITE,
    Committed,
    Free,
    Lock,
    LockState,
    WriteKind,
    decode_lock,
    decode_write,
    encode_lock,
    inlined,
)
from percolator._errors import (
    CommitUnknownError,
    ConflictError,
    CoordinationError,
    InvalidArgument,
    PercolatorError,
)
from percolator._internals import internals
from percolator._lock_resolver import check_txn_status, release, resolve_lock, write_cells
from percolator._notify_index import write_entries
from percolator._store import (
    ATOMICALLY,
    CAS_DELETES,
    PUT_ROW,
    SET_UNLESS,
    Cell,
    Guard,
    GuardedSet,
    Mutation,
    Read,
    Store,
    declares,
    offered,
)
from percolator.metrics import inc as _inc
from percolator.metrics import observe as _observe

if TYPE_CHECKING:
    from percolator._cluster import Cluster
    from percolator._observer_hooks import Settlement
    from percolator._transaction import TransactionBase

__all__ = [
    "CrashPoint", "commit_group", "commit_transaction", "committed_anyway",
    "free_locks_may_stay", "one_phase_steps",
]

log = logging.getLogger(__name__)

NOTIFY_WEAK = b"w"
_LOCK_PREFIX, _WRITE_PREFIX = f"{LOCK}:", f"{WRITE}:"
_ROLLBACK_TAG = WriteKind.ROLLBACK.value
"""First byte of every rollback write record."""


@dataclass(frozen=True, slots=True)
class CrashPoint:
    """Where a test harness abandons a commit, as if the committer died there.

    ``phase`` is one of ``"prewrite"`` (after ``index + 1`` cells are locked, the
    primary first), ``"commit_point"`` (right after the primary's commit CAS) or
    ``"commit"`` (after ``index`` secondaries are released).
    """

    phase: str
    index: int = 0


class SimulatedCrash(BaseException):
    """Raised at a :class:`CrashPoint`; leaves the store exactly as a dead process would."""


@dataclass(slots=True)
class _Cell:
    table: str
    row: bytes
    column: str
    value: bytes | None
    notify: bool
    held: bytes = b""

    @property
    def inline(self) -> bytes | None:
        """A small put's value: carried by the lock, then by the write record, with no
        data cell."""
        return inlined(self.value)


def _conflict(start_ts: int, table: str, row: bytes, column: str, why: str,
              ts: int | None) -> ConflictError:
    return ConflictError(
        f"write-write conflict on {table}/{row!r}/{column}: {why} (transaction {start_ts})",
        start_ts=start_ts, conflict_ts=ts, table=table, row=row, column=column,
    )


def _check_writes(start_ts: int, table: str, row: bytes, column: str,
                  writes: Sequence[Cell]) -> None:
    """First committer wins: a change committed after *start_ts* is a conflict, and so
    is a rollback record at it (the transaction was rolled back by a cleaner)."""
    for ts, value in writes:
        kind, _ = decode_write(value)
        if kind is WriteKind.ROLLBACK:
            if ts == start_ts:
                raise _conflict(start_ts, table, row, column, "this transaction was rolled back",
                                ts)
            continue
        if ts > start_ts:
            raise _conflict(start_ts, table, row, column, f"committed at {ts} after our start",
                            ts)


class _Committer:
    def __init__(self, txn: TransactionBase, crash: CrashPoint | None) -> None:
        self.txn = txn
        self.cluster = txn.cluster
        self.store = internals(txn.cluster).store
        self.crash = crash
        self.start_ts = txn.start_ts
        observed = self.cluster.observed_columns()
        self.cells = [
            _Cell(t, r, c, v, (t, c) in observed) for (t, r, c), v in txn._writes.items()
        ]
        self.primary = self.cells[0]
        self.notifies = bool(txn._weak) or (bool(observed) and any(c.notify for c in self.cells))
        """Whether the commit makes notifications (weak ones, or of observed columns)."""
        self.owner = internals(self.cluster).coordination.current_owner()
        self.ttl_ms = int(self.cluster.lock_ttl * 1000)
        self.locked: list[_Cell] = []
        self.refreshed_at = time.monotonic()

    @property
    def recheck_after_lock(self) -> bool:
        """Whether a lock taken from FREE needs its write records checked again
        (:func:`free_locks_may_stay`): asked by two-phase prewrites only."""
        return free_locks_may_stay(self.store)

    def _maybe_crash(self, phase: str, index: int) -> None:
        if self.crash is not None and self.crash == CrashPoint(phase, index):
            raise SimulatedCrash(f"simulated crash at {phase}[{index}]")

    def _lock_for(self, cell: _Cell) -> Lock:
        p = self.primary
        return Lock(
            start_ts=self.start_ts,
            primary_table=p.table,
            primary_row=p.row,
            primary_column=p.column,
            owner=self.owner,
            wall_ms=int(time.time() * 1000),
            ttl_ms=self.ttl_ms,
            delete=cell.value is None,
            notify=cell.notify,
            value=cell.inline,
        )

    # --- prewrite ---------------------------------------------------------------------

    def _conflict(self, cell: _Cell, why: str, ts: int | None) -> ConflictError:
        return _conflict(self.start_ts, cell.table, cell.row, cell.column, why, ts)

    def _read_for_prewrite(self, cells: list[_Cell]) -> dict[int, tuple[bytes | None, list[Cell]]]:
        """One batched read per table: each cell's lock and its newest write record at or
        above start_ts (see :func:`_read_prewrite_state`)."""
        return _read_prewrite_state([(self, cells)])

    def _check_writes(self, cell: _Cell, writes: list[Cell]) -> None:
        _check_writes(self.start_ts, cell.table, cell.row, cell.column, writes)

    def _data_puts(self, cell: _Cell) -> list[tuple[str, int, bytes]]:
        """A large put's data cell; a small one travels in its lock (no data cell)."""
        if cell.value is None or cell.inline is not None:
            return []
        return [(f"{DATA}:{cell.column}", self.start_ts, cell.value)]

    def _guards(self, cell: _Cell) -> list[Guard]:
        """The conflict conditions of :meth:`_prewrite` as cells of the row: a lock that
        is not FREE, and what :meth:`_check_writes` refuses (a PUT/DELETE record after
        start_ts, a ROLLBACK record at it). Write records carry their kind in their
        first byte, lock values their state."""
        lock, write = f"{LOCK}:{cell.column}", f"{WRITE}:{cell.column}"
        return [
            *_not_starting_with(FREE_TAG, lock, latest=True),
            *_not_starting_with(_ROLLBACK_TAG, write, min_ts=self.start_ts + 1),
            Guard(write, min_ts=self.start_ts, max_ts=self.start_ts, value_from=_ROLLBACK_TAG,
                  value_to=_successor(_ROLLBACK_TAG)),
        ]

    def _prewrite_guarded(self, store: GuardedSet, cell: _Cell) -> bool:
        """Lock *cell* in one conditional mutation that the store applies only if no
        conflict condition holds at that moment (``set_unless``): checked and locked in
        one atomic step, no read. False: some condition held; nothing was written."""
        held = encode_lock(self._lock_for(cell))
        if not store.set_unless(
            cell.table, cell.row, f"{LOCK}:{cell.column}", held, self._guards(cell),
            self._data_puts(cell),
        ):
            return False
        cell.held = held
        self.locked.append(cell)
        return True

    def _prewrite(self, cell: _Cell, lock_raw: bytes | None, writes: list[Cell]) -> None:
        for attempt in range(20):
            self._check_writes(cell, writes)
            state: LockState | None = decode_lock(lock_raw) if lock_raw is not None else None
            if lock_raw is not None and not isinstance(state, Free):
                # Another transaction holds it (or its primary awaits clean-up): clean it
                # up if its fate is decided or its owner is dead, else give way.
                if not resolve_lock(internals(self.cluster), cell.table, cell.row, cell.column,
                                    lock_raw):
                    raise self._conflict(
                        cell, f"locked by live transaction {getattr(state, 'start_ts', '?')}",
                        getattr(state, "start_ts", None),
                    )
            else:
                held = encode_lock(self._lock_for(cell))
                if lock_cas(
                    self.store, cell.table, cell.row, f"{LOCK}:{cell.column}", lock_raw, held,
                    self._data_puts(cell),
                ):
                    cell.held = held
                    self.locked.append(cell)
                    if self.recheck_after_lock:
                        self._check_writes(cell, self._read_for_prewrite([cell])[id(cell)][1])
                    return
                if attempt > 2:
                    raise self._conflict(cell, "the lock cell changed while we locked it", None)
            lock_raw, writes = self._read_for_prewrite([cell])[id(cell)]
        raise self._conflict(cell, "could not take the lock", None)

    def _refresh_primary(self) -> None:
        """A long commit keeps its primary's wall time fresh so cleaners leave it alone."""
        if (time.monotonic() - self.refreshed_at) * 1000 < self.ttl_ms / 3:
            return
        p = self.primary
        fresh = encode_lock(self._lock_for(p))
        if not lock_cas(self.store, p.table, p.row, f"{LOCK}:{p.column}", p.held, fresh):
            raise self._conflict(p, "rolled back by a cleaner while committing", None)
        p.held = fresh
        self.refreshed_at = time.monotonic()

    def prewrite(self) -> None:
        """Lock the primary, then the secondaries (one batched read for all of them),
        or, where the store can test the conflict conditions itself, one conditional
        mutation per cell, reading only a cell whose conditions held."""
        with internals(self.cluster).taking_locks():
            self._prewrite_all()

    def _prewrite_all(self) -> None:
        guarded = offered(self.store, SET_UNLESS)
        found: dict[int, tuple[bytes | None, list[Cell]]] = {}
        together = self._locked_together(guarded) if guarded is not None else set()
        for index, cell in enumerate(self.cells):
            if index:
                self._refresh_primary()
            if id(cell) not in together and (
                    guarded is None or not self._prewrite_guarded(guarded, cell)):
                if id(cell) not in found:
                    batch = [cell] if guarded is not None or index == 0 else self.cells[1:]
                    found.update(self._read_for_prewrite(batch))
                self._prewrite(cell, *found[id(cell)])
            self._maybe_crash("prewrite", index)

    def _locked_together(self, store: GuardedSet) -> set[int]:
        """Where the store tests conflict conditions itself, lock the cells that share
        the primary's row in one conditional mutation (an observer's output and its
        acknowledgement, say): the primary's lock set, theirs and their data put, only
        if no cell of them meets a conflict condition. Returns the ids of the cells
        locked so (none when some condition held: each then goes its own way)."""
        p = self.primary
        same_row = [c for c in self.cells if (c.table, c.row) == (p.table, p.row)]
        if len(same_row) < 2:
            return set()
        held = [encode_lock(self._lock_for(c)) for c in same_row]
        puts = [put for c in same_row for put in self._data_puts(c)]
        puts += [(f"{LOCK}:{c.column}", 0, h) for c, h in zip(same_row[1:], held[1:], strict=True)]
        if not store.set_unless(p.table, p.row, f"{LOCK}:{p.column}", held[0],
                                [g for c in same_row for g in self._guards(c)], puts):
            return set()
        for cell, value in zip(same_row, held, strict=True):
            cell.held = value
            self.locked.append(cell)
        return {id(c) for c in same_row}

    def abort(self) -> None:
        """Release our locks (secondaries first); the data left at start_ts is never
        referenced by a write record, so it stays invisible."""
        for cell in reversed(self.locked):
            try:
                release(internals(self.cluster), cell.table, cell.row, cell.column, cell.held,
                        self.start_ts, None)
            except PercolatorError:
                log.warning("could not release lock of %d on %s/%r/%s; readers will clean it",
                            self.start_ts, cell.table, cell.row, cell.column)

    # --- commit -------------------------------------------------------------------------

    def commit_point(self, commit_ts: int) -> None:
        p = self.primary
        # Not under an identity whose session expired: others may treat its locks as
        # abandoned (raises CoordinationError; the caller releases the locks).
        internals(self.cluster).coordination.confirm_owner(self.owner)
        self._refresh_primary()
        column = f"{LOCK}:{p.column}"
        delete, notify = p.value is None, p.notify
        settles = self._settled_with_commit_point()
        try:
            if self.store.atomic_row_cas:
                won = lock_cas(
                    self.store, p.table, p.row, column, p.held,
                    encode_lock(Free(self.start_ts, True)),
                    write_cells(p.column, self.start_ts, commit_ts, delete, notify, p.inline)
                    + self._primary_row_releases(commit_ts),
                    settles,
                )
                if won and settles:
                    # Left in place if a cleaner rolled the primary forward first
                    # (lock_cas also answers True then): a later pass finds the
                    # notification acknowledged and deletes it.
                    assert self.txn._settlement is not None
                    self.txn._settlement.done = True
            else:
                decided = encode_lock(Committed(self.start_ts, commit_ts, delete, notify, p.inline))
                won = lock_cas(self.store, p.table, p.row, column, p.held, decided)
        except PercolatorError as e:
            won = self._committed_anyway(commit_ts, e)
        else:
            won = won or self._committed_anyway(commit_ts, None)
        if not won:
            raise self._conflict(p, "rolled back by a cleaner before the commit point", None)
        self.txn.commit_ts = commit_ts
        internals(self.cluster).stats["commits"] += 1
        self._maybe_crash("commit_point", 0)
        if not self.store.atomic_row_cas:
            try:
                release(internals(self.cluster), p.table, p.row, p.column, decided, self.start_ts,
                        (commit_ts, delete, notify), inline=p.inline)
            except PercolatorError:
                log.warning("committed %d but could not release its primary", self.start_ts)

    def _settled_with_commit_point(self) -> list[tuple[str, int]]:
        """The notification an observer run served (its settlement), to delete in the
        commit point's own compare-and-set where the store can (``CAS_DELETES``) and it
        lies in the primary's row: one store call fewer per run than the worker's
        deletion after the commit, and no window in which the run is committed and its
        notification still pending. The versions at or below the newest one the run
        read: a change committed meanwhile notifies again."""
        settlement = self.txn._settlement  # see percolator._observer_hooks
        p = self.primary
        if settlement is None or not declares(self.store, CAS_DELETES):
            return []
        if (settlement.table, settlement.row) != (p.table, p.row):
            return []
        return [(settlement.notify_column, settlement.newest)]

    def _primary_row_secondaries(self) -> list[_Cell]:
        """The locked secondaries in the primary's row, where the store writes other
        cells of a row atomically with a compare-and-set: the commit point releases
        them itself."""
        p = self.primary
        if not self.store.atomic_row_cas:
            return []
        return [c for c in self.locked[1:] if (c.table, c.row) == (p.table, p.row)]

    def _primary_row_releases(self, commit_ts: int) -> list[tuple[str, int, bytes]]:
        """The commit point's puts for :meth:`_primary_row_secondaries`: each one's
        write record (and notify cell) and a FREE lock. Written with the primary's
        compare-and-set from our LOCKED value, they need no compare of their own:
        only the holder changes a LOCKED cell until the primary is decided (DESIGN.md
        section 5, invariant A), and this step is that decision."""
        puts: list[tuple[str, int, bytes]] = []
        for cell in self._primary_row_secondaries():
            puts += write_cells(cell.column, self.start_ts, commit_ts, cell.value is None,
                                cell.notify, cell.inline)
            puts.append((f"{LOCK}:{cell.column}", 0, encode_lock(Free(self.start_ts, True))))
        return puts

    def _committed_anyway(self, commit_ts: int, error: PercolatorError | None) -> bool:
        """:func:`committed_anyway` for this transaction's primary."""
        return committed_anyway(self.cluster, self._lock_for(self.primary), commit_ts, error)

    def commit_secondaries(self, commit_ts: int) -> None:
        released = {id(c) for c in self._primary_row_secondaries()}
        secondaries = [c for c in self.locked[1:] if id(c) not in released]
        recorded = not self.store.atomic_row_cas
        if recorded:  # all write records in one batch; each release then only frees
            by_table: dict[str, list[Mutation]] = {}
            for cell in secondaries:
                by_table.setdefault(cell.table, []).append(Mutation(
                    cell.row, write_cells(cell.column, self.start_ts, commit_ts,
                                          cell.value is None, cell.notify, cell.inline)))
            for table, mutations in by_table.items():
                self.store.mutate_rows(table, mutations)
        for index, cell in enumerate(secondaries):
            self._maybe_crash("commit", index)
            release(internals(self.cluster), cell.table, cell.row, cell.column, cell.held,
                    self.start_ts,
                    (commit_ts, cell.value is None, cell.notify), recorded=recorded,
                    inline=cell.inline)
        self._maybe_crash("commit", len(secondaries))


def committed_anyway(
    cluster: Cluster, lock: Lock, commit_ts: int, error: PercolatorError | None
) -> bool:
    """Whether the commit at *commit_ts* of the transaction of *lock* (whose primary
    it names) applied although the commit point's compare-and-set said no (*error*
    None) or failed with *error*: an attempt that applied may have been rolled forward
    by a cleaner before its answer (a replay, or none) came back
    (``percolator/_cas.py``). The primary's lock and records tell; a primary still
    locked after an error may yet be committed by the call in flight.

    :raises CommitUnknownError: the outcome cannot be told.
    """
    unknown = (f"the store failed at the commit point of transaction {lock.start_ts}: "
               f"{error}; it may or may not have committed")
    try:
        status = check_txn_status(internals(cluster), lock)
    except PercolatorError as e:
        raise CommitUnknownError(
            unknown if error is not None else
            f"the commit point of transaction {lock.start_ts} answered no and its primary "
            f"could not be read again: {e}; it may or may not have committed"
        ) from (error or e)
    if status.commit_ts == commit_ts:
        return True
    if error is not None and status.pending is not None:
        raise CommitUnknownError(unknown) from error
    return False


def free_locks_may_stay(store: Store) -> bool:
    """Whether a commit on *store* may leave an existing FREE lock as it was (the
    one-phase commit of a store that can write ``atomically``). There, a
    compare-and-set from FREE does not prove that nothing committed since the lock was
    read: who locks a cell that way must check its write records again once locked
    (nothing can commit past the lock)."""
    return declares(store, ATOMICALLY)


def _successor(tag: bytes) -> bytes:
    """The smallest value above every value starting with the one-byte *tag*."""
    return bytes([tag[0] + 1])


def _not_starting_with(
    tag: bytes, column: str, *, min_ts: int = 0, latest: bool = False
) -> list[Guard]:
    """Guards matching a value of *column* whose first byte is not the one-byte *tag*."""
    return [Guard(column, min_ts=min_ts, latest=latest, value_to=tag),
            Guard(column, min_ts=min_ts, latest=latest, value_from=_successor(tag))]


def _write_weak_notifications(txn: TransactionBase, commit_ts: int) -> None:
    # At commit_ts, drawn before this write: it may land under a worker's deletion of a
    # newer notification of the cell, whose run served it (percolator/_store.py).
    by_table: dict[str, list[Mutation]] = {}
    for table, row, column in txn._weak:
        by_table.setdefault(table, []).append(
            Mutation(row, [(f"{NOTIFY}:{column}", commit_ts, NOTIFY_WEAK)])
        )
    for table, mutations in by_table.items():
        internals(txn.cluster).store.mutate_rows(table, mutations)


def _write_notifications(txn: TransactionBase, cells: list[_Cell], commit_ts: int) -> None:
    """Before the commit point: the weak notify cells, then the index entries of every
    notification the commit makes (``percolator/_notify_index.py``, stores that have
    it), so that whatever writes the strong notify cells later (this committer, or a
    cleaner rolling it forward) finds their entries there."""
    _write_notifications_of(txn, [(c.table, c.row, c.column) for c in cells if c.notify],
                            commit_ts)


def _write_notifications_of(txn: TransactionBase, strong: list[tuple[str, bytes, str]],
                            commit_ts: int) -> None:
    """:func:`_write_notifications`, given the cells of the *strong* notifications."""
    if txn._weak:
        _write_weak_notifications(txn, commit_ts)
    write_entries(internals(txn.cluster), [*txn._weak, *strong], commit_ts)


def _commit_one_phase(txn: TransactionBase, steps: _OnePhaseSteps) -> tuple[int, bool] | None:
    """Commit *txn* in one atomic store step (the embedded store, :func:`one_phase_steps`).

    One SQLite write transaction checks every cell for conflicts, then writes the
    write records, each carrying its value (no data cell), at a commit timestamp drawn
    inside it, a FREE lock where a cell had no lock cell yet (so a lock cell exists
    wherever a write record does), the notification an observer run served, and the
    weak notifications. An existing FREE lock is left as it was: a two-phase prewriter
    that read it before this commit checks the cell again once it has locked it.
    The commit timestamp is published as in flight from its draw until after the
    COMMIT (:meth:`~percolator._timestamps.HostTimestamps.in_flight`): a start
    timestamp drawn meanwhile is below the commit (from the gap left below it) or is
    handed out once the commit is visible (see docs/timestamps.md).

    The path every application transaction takes, so it is flat: the buffered writes
    as they are, one store read per row, no committer or per-cell objects (those are
    made only for the two-phase path). The checks and the writes are the group
    commit's (:func:`_one_phase_cell_ok`, :func:`_one_phase_puts`). Returns the commit
    timestamp and whether the commit made notifications, or None, having written
    nothing, when a cell is locked by another transaction (the two-phase path
    resolves it) or the persisted block of timestamps has no room.

    :raises ConflictError: a cell was written since the transaction's start.
    """
    cluster, start_ts = txn.cluster, txn.start_ts
    store = internals(cluster).store
    observed = cluster.observed_columns()
    rows: dict[tuple[str, bytes], list[tuple[str, bytes | None]]] = {}
    for (table, row, column), value in txn._writes.items():
        cells = rows.get((table, row))
        if cells is None:
            rows[(table, row)] = [(column, value)]
        else:
            cells.append((column, value))
    atomically, in_flight = steps
    with in_flight(atomically) as draw:
        found = [
            store.read_rows(table, [row], _prewrite_reads(tuple(c for c, _ in cells))).get(row, {})
            for (table, row), cells in rows.items()
        ]
        # Inside the atomic step, after its reads: no GC deletion can fall between
        # this check and the writes (see percolator._safe_point).
        internals(cluster).safe_point.check(start_ts)
        for ((table, row), cells), row_cells in zip(rows.items(), found, strict=True):
            for column, _ in cells:
                writes = row_cells.get(_WRITE_PREFIX + column)
                lock = row_cells.get(_LOCK_PREFIX + column)
                if not _one_phase_cell_ok(
                        start_ts, table, row, column, lock[0][1] if lock else None,
                        _writes_since(store, table, row, column, start_ts, writes)
                        if writes else ()):
                    return None
        taken = draw(1)
        if taken is None:
            return None
        commit_ts = taken[0]
        strong: list[tuple[str, bytes, str]] = []
        by_table: dict[str, list[Mutation]] = {}
        for ((table, row), cells), row_cells in zip(rows.items(), found, strict=True):
            puts: list[tuple[str, int, bytes]] = []
            for column, value in cells:
                notify = bool(observed) and (table, column) in observed
                if notify:
                    strong.append((table, row, column))
                puts += _one_phase_puts(start_ts, commit_ts, column, value, notify,
                                        _LOCK_PREFIX + column in row_cells)
            mutations = by_table.get(table)
            if mutations is None:
                by_table[table] = [Mutation(row, puts)]
            else:
                mutations.append(Mutation(row, puts))
        settles = _settles_mutation(txn, by_table)
        row_put = offered(store, PUT_ROW)
        for table, mutations in by_table.items():
            if row_put is not None and len(mutations) == 1 and not mutations[0].deletes:
                row_put.put_row(table, mutations[0].row, mutations[0].puts)  # no batching
            else:
                store.mutate_rows(table, mutations)
        notifies = bool(txn._weak) or bool(strong)
        if notifies:
            _write_notifications_of(txn, strong, commit_ts)
        if settles is not None:
            settles.done = True
        return commit_ts, notifies


_OnePhaseSteps = tuple[
    Callable[[], AbstractContextManager[None]],
    Callable[[Callable[[], AbstractContextManager[None]]],
             AbstractContextManager[Callable[[int], range | None]]]]


def one_phase_steps(cluster: Cluster) -> _OnePhaseSteps | None:
    """Where *cluster* commits in one phase (the embedded store): the store's atomic
    step (``atomically``) and the timestamp source's publication of commit timestamps
    in flight (``in_flight``, which enters the atomic step); None elsewhere."""
    atomic = offered(internals(cluster).store, ATOMICALLY)
    in_flight = getattr(internals(cluster).timestamps, "in_flight", None)
    if atomic is None or in_flight is None or not cluster.one_phase_commit:
        return None
    return atomic.atomically, in_flight


def _one_phase_cell_ok(start_ts: int, table: str, row: bytes, column: str,
                       lock_raw: bytes | None, writes: Sequence[Cell]) -> bool:
    """The one-phase checks of one cell, given its newest lock value and its write
    records at or above *start_ts* (inside the atomic step, after the safe-point
    check): False when another transaction holds its lock (or its primary is being
    decided), which the two-phase path resolves.

    :raises ConflictError: first committer wins (:func:`_check_writes`).
    """
    if writes:
        _check_writes(start_ts, table, row, column, writes)
    return lock_raw is None or lock_raw[:1] == FREE_TAG  # else held, or being decided


def _one_phase_puts(start_ts: int, commit_ts: int, column: str, value: bytes | None,
                    notify: bool, has_lock: bool) -> list[tuple[str, int, bytes]]:
    """A one-phase commit's puts for one cell: its write record carrying the value (and
    its notify cell), and a FREE lock where the cell had no lock cell."""
    puts = write_cells(column, start_ts, commit_ts, value is None, notify, value)
    if not has_lock:
        puts.append((_LOCK_PREFIX + column, 0, encode_lock(Free(start_ts, True))))
    return puts


def _settles_mutation(
    txn: TransactionBase, by_table: dict[str, list[Mutation]]
) -> Settlement | None:
    """Add to *by_table* the deletion of the notification an observer run serves, if
    *txn* is such a run (its settlement, returned): its one-phase commit serves it in
    the same atomic step."""
    settlement = txn._settlement  # see percolator._observer_hooks
    if settlement is not None:
        by_table.setdefault(settlement.table, []).append(Mutation(
            settlement.row, deletes=[(settlement.notify_column, settlement.newest)]))
    return settlement


def _one_phase_check(
    committer: _Committer, found: dict[int, tuple[bytes | None, list[Cell]]],
) -> bool:
    """A group member's checks inside the atomic step (see :func:`_one_phase_cell_ok`),
    given what :func:`_read_prewrite_state` read for the whole group. False when a
    cell is locked by another transaction.

    :raises ConflictError: a cell was written since the transaction's start.
    """
    # Inside the atomic step, after its reads: no GC deletion can fall between
    # this check and the writes (see percolator._safe_point).
    internals(committer.cluster).safe_point.check(committer.start_ts)
    for cell in committer.cells:
        lock_raw, writes = found[id(cell)]
        if not _one_phase_cell_ok(committer.start_ts, cell.table, cell.row, cell.column,
                                  lock_raw, writes):
            return False
    return True


def _one_phase_write(committer: _Committer, found: dict[int, tuple[bytes | None, list[Cell]]],
                     commit_ts: int, batch: dict[str, list[Mutation]]) -> None:
    """A group member's writes (:func:`_one_phase_puts`, and the notification an
    observer run served), added to *batch* for the caller to write (a group writes all
    of its members' at once), then its notifications."""
    start_ts = committer.start_ts
    for cell in committer.cells:
        batch.setdefault(cell.table, []).append(Mutation(cell.row, _one_phase_puts(
            start_ts, commit_ts, cell.column, cell.value, cell.notify,
            found[id(cell)][0] is not None)))
    settles = _settles_mutation(committer.txn, batch)
    if committer.notifies:
        _write_notifications(committer.txn, committer.cells, commit_ts)
    if settles is not None:
        settles.done = True


_PREWRITE_READS: dict[tuple[str, ...], list[Read]] = {}
"""The reads of :func:`_read_prewrite_state` by columns (the same for every start)."""


def _prewrite_reads(columns: tuple[str, ...]) -> list[Read]:
    """The newest lock and the newest write record of each of *columns* (at any
    timestamp: the same reads for every start, cached)."""
    reads = _PREWRITE_READS.get(columns)
    if reads is None:
        reads = [Read(LOCK, columns), Read(WRITE, columns)]
        if len(_PREWRITE_READS) < 1024:
            _PREWRITE_READS[columns] = reads
    return reads


def _writes_since(store: Any, table: str, row: bytes, column: str, start_ts: int,
                  newest: list[Cell]) -> list[Cell]:
    """A cell's write records at or above *start_ts*, given the *newest* one read: it,
    if at or above the start; only when it is a rollback above the start, which may
    hide an older commit after the start, are all of them read."""
    writes = [w for w in newest if w[0] >= start_ts]
    if writes and writes[0][0] > start_ts and writes[0][1][:1] == _ROLLBACK_TAG:
        writes = store.read_rows(
            table, [row], [Read(WRITE, (column,), min_ts=start_ts, versions=None)],
        ).get(row, {}).get(f"{WRITE}:{column}", [])
    return writes


def _read_prewrite_state(
    members: Sequence[tuple[_Committer, list[_Cell]]],
) -> dict[int, tuple[bytes | None, list[Cell]]]:
    """For each cell of each ``(committer, cells)`` (keyed by ``id(cell)``): its lock and
    its write records at or above that committer's start_ts (:func:`_writes_since`),
    read with one store call per table for all of them (a group commit checks its
    members at once)."""
    by_table: dict[str, list[tuple[_Committer, _Cell]]] = {}
    for committer, cells in members:
        for cell in cells:
            by_table.setdefault(cell.table, []).append((committer, cell))
    found: dict[int, tuple[bytes | None, list[Cell]]] = {}
    for table, group in by_table.items():
        store = group[0][0].store
        columns: tuple[str, ...]
        if len(group) == 1:  # a single-cell transaction: no duplicates to drop
            rows, columns = [group[0][1].row], (group[0][1].column,)
        else:
            rows = list(dict.fromkeys(c.row for _, c in group))
            columns = tuple(dict.fromkeys(c.column for _, c in group))
        # The newest record is, for each member, its newest at or above its own start
        # when it is at or above that start at all.
        result = store.read_rows(table, rows, _prewrite_reads(columns))
        for committer, cell in group:
            row_cells = result.get(cell.row, {})
            lock = row_cells.get(f"{LOCK}:{cell.column}")
            writes = _writes_since(store, table, cell.row, cell.column, committer.start_ts,
                                   row_cells.get(f"{WRITE}:{cell.column}", []))
            found[id(cell)] = (lock[0][1] if lock else None, writes)
    return found


_COMMITTED: dict[str, Iterator[int]] = {}
"""``percolator_transactions_committed_total`` by kind, stepped in line."""


def _record(kind: str, began: float, error: BaseException | None) -> None:
    """The metrics of one commit that ended (with *error*, or committed)."""
    if error is None:
        if _metrics._enabled:
            committed = _COMMITTED.get(kind)
            if committed is None:
                committed = _COMMITTED.setdefault(kind, _metrics.counter(
                    "percolator_transactions_committed_total", kind))
            next(committed)
    elif isinstance(error, ConflictError):
        _inc("percolator_transactions_conflicted_total", kind)
    else:
        _inc("percolator_transactions_failed_total", kind)
    _observe("percolator_commit_duration_seconds", time.perf_counter() - began, kind)


def commit_transaction(txn: TransactionBase, crash: CrashPoint | None = None) -> int:
    """Commit *txn* (see the module docstring); *crash* is for test harnesses only
    (a commit with a crash point always takes the two-phase path)."""
    began = time.perf_counter()
    try:
        commit_ts = _commit_transaction(txn, crash)
    except BaseException as e:
        _record(txn._kind, began, e)
        raise
    _record(txn._kind, began, None)
    return commit_ts


def commit_group(txns: Sequence[TransactionBase]) -> list[int | PercolatorError]:
    """Commit several transactions of one cluster made by this thread, each as if
    alone, and return each one's commit timestamp or the error its commit raised.

    Where the store commits in one phase (the embedded store), they share one SQLite
    write transaction: each makes its own conflict checks (which see the commits
    before it in the group) and draws its own commit timestamp, and one that
    conflicts writes nothing and leaves the others be; the group spares a write
    transaction (BEGIN, COMMIT, the writers' turn) per commit. A store failure in the
    step fails every transaction of it (none committed). One that meets a lock, and
    every one elsewhere, is committed on its own afterwards.
    """
    if not txns:
        return []
    cluster = txns[0].cluster
    if any(t.cluster is not cluster for t in txns):
        raise InvalidArgument("commit_group: every transaction must be of one cluster")
    began = time.perf_counter()
    results: list[int | PercolatorError | None] = [None] * len(txns)
    steps = one_phase_steps(cluster)
    grouped: list[tuple[int, _Committer]] = []
    if steps is not None:
        for i, txn in enumerate(txns):
            if not txn._writes or txn._closed:
                continue
            try:
                internals(cluster).safe_point.check(txn.start_ts)
            except PercolatorError as e:
                txn._closed = True
                results[i] = e
                continue
            txn._closed = True
            grouped.append((i, _Committer(txn, None)))
    if grouped:
        assert steps is not None
        atomically, in_flight = steps
        try:
            with in_flight(atomically) as draw:
                # Every check first, then every draw and write: the commit timestamps
                # are in flight (holding back other clients' start timestamps) only
                # for the writes. A member that writes a cell an earlier member
                # writes conflicts with it, as it would meet its record in the store.
                checked: list[tuple[int, _Committer, dict[int, Any]]] = []
                taken: set[tuple[str, bytes, str]] = set()
                state = _read_prewrite_state([(member, member.cells) for _, member in grouped])
                for i, member in grouped:
                    try:
                        unlocked = _one_phase_check(member, state)
                        cells = {(c.table, c.row, c.column) for c in member.cells}
                        if not taken.isdisjoint(cells):
                            raise member._conflict(
                                next(c for c in member.cells
                                     if (c.table, c.row, c.column) in taken),
                                "written by a transaction committed with it", None)
                    except ConflictError as e:
                        internals(cluster).stats["conflicts"] += 1
                        results[i] = e
                        continue
                    if unlocked:
                        taken |= cells
                        checked.append((i, member, state))
                batch: dict[str, list[Mutation]] = {}
                # None: no room left in the block; they go on their own (two-phase).
                stamps = draw(len(checked)) if checked else None
                for (i, member, found), commit_ts in zip(checked, stamps or (), strict=False):
                    _one_phase_write(member, found, commit_ts, batch)
                    results[i] = commit_ts
                for table, mutations in batch.items():  # one write per table for all
                    internals(cluster).store.mutate_rows(table, mutations)
        except PercolatorError as e:  # rolled back: none of the group committed
            for i, _ in grouped:
                if not isinstance(results[i], ConflictError):
                    results[i] = e
    members = dict(grouped)
    outcomes: list[int | PercolatorError] = []
    for i, txn in enumerate(txns):
        result = results[i]
        committer = members.get(i)
        if isinstance(result, int):
            assert committer is not None
            txn.commit_ts = result
            internals(cluster).stats["commits"] += 1
            _wake(committer)
        elif result is None:  # not grouped, or met a lock: on its own
            try:
                if committer is not None:
                    result = _finish_two_phase(committer)
                else:
                    txn._check_open()
                    result = _commit_transaction(txn, None)
            except PercolatorError as e:
                result = e
        _record(txn._kind, began, result if isinstance(result, PercolatorError) else None)
        outcomes.append(result)
    return outcomes


def _commit_transaction(txn: TransactionBase, crash: CrashPoint | None) -> int:
    cluster = txn.cluster
    txn._closed = True
    if not txn._writes:
        if txn._weak:
            commit_ts = internals(cluster).timestamps.get_timestamp()
            _write_notifications(txn, [], commit_ts)
            internals(cluster).wake_observers()
        else:
            commit_ts = txn.start_ts
        txn.commit_ts = commit_ts
        return commit_ts
    # Before anything (an overtaken transaction is told so, not sent into conflicts
    # with what GC left), and again where it counts, after the prewrite.
    internals(cluster).safe_point.check(txn.start_ts)
    steps = one_phase_steps(cluster) if crash is None else None
    if steps is not None:
        try:
            one_phase = _commit_one_phase(txn, steps)
        except ConflictError:
            internals(cluster).stats["conflicts"] += 1
            raise
        if one_phase is not None:
            commit_ts, notifies = one_phase
            txn.commit_ts = commit_ts
            internals(cluster).stats["commits"] += 1
            if notifies:
                internals(cluster).wake_observers()
            return commit_ts
    return _finish_two_phase(_Committer(txn, crash))


def _finish_two_phase(committer: _Committer) -> int:
    cluster = committer.cluster
    try:
        commit_ts = _commit_two_phase(committer)
    except SimulatedCrash:
        raise  # a dead committer sweeps nothing
    except BaseException:
        internals(cluster).sweep_locks()
        raise
    internals(cluster).sweep_locks()
    _wake(committer)
    return commit_ts


def _wake(committer: _Committer) -> None:
    if committer.notifies:
        internals(committer.cluster).wake_observers()


def _commit_two_phase(committer: _Committer) -> int:
    txn, cluster = committer.txn, committer.cluster
    try:
        committer.prewrite()
        # After the prewrite, before the commit point: a transaction overtaken by the
        # GC safe point never commits (see percolator._safe_point).
        internals(cluster).safe_point.check(txn.start_ts)
    except ConflictError:
        internals(cluster).stats["conflicts"] += 1
        committer.abort()
        raise
    except SimulatedCrash:
        raise
    except BaseException:
        committer.abort()
        raise
    try:
        commit_ts = internals(cluster).timestamps.get_timestamp()
        # Weak notifications go before the commit point, so a committer that dies after
        # it cannot lose them (nothing else would write them); one that fails at the
        # commit point leaves a spurious one, which only runs an observer for nothing.
        # The index entries of strong ones go here too (a spurious entry is deleted by
        # the first worker that finds its cell settled).
        _write_notifications(txn, committer.cells, commit_ts)
    except BaseException:
        committer.abort()
        raise
    try:
        committer.commit_point(commit_ts)
    except ConflictError:
        internals(cluster).stats["conflicts"] += 1
        committer.abort()
        raise
    except CoordinationError:  # raised before the commit point's write: nothing committed
        committer.abort()
        raise
    # Committed: what follows only cleans up; a failure leaves locks that readers
    # roll forward.
    try:
        committer.commit_secondaries(commit_ts)
    except SimulatedCrash:
        raise
    except PercolatorError:
        log.warning("transaction %d committed at %d; clean-up left to readers",
                    txn.start_ts, commit_ts, exc_info=True)
    return commit_ts
