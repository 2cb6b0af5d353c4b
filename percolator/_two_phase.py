"""Percolator's two-phase commit, on every store: prewrite every cell under a lock
(the primary first), then the commit point on the primary and the secondaries
(:mod:`percolator._commit` says how many round trips; docs/transactions.md why it is
safe)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from percolator._cas import lock_cas
from percolator._commit_checks import (
    _ROLLBACK_TAG,
    CrashPoint,
    SimulatedCrash,
    WriteSet,
    _Cell,
    _check_writes,
    _conflict,
    _not_starting_with,
    _read_prewrite_state,
    _successor,
    _write_notifications,
    cells_of,
)
from percolator._encoding import (
    DATA,
    FREE_TAG,
    LOCK,
    WRITE,
    Committed,
    Free,
    Lock,
    LockState,
    decode_lock,
    encode_lock,
)
from percolator._errors import (
    CommitUnknownError,
    ConflictError,
    CoordinationError,
    PercolatorError,
)
from percolator._lock_resolver import (
    _Flight,
    check_txn_status,
    release,
    resolve_lock,
    write_cells,
)
from percolator._store import (
    ATOMICALLY,
    CAS_DELETES,
    SET_UNLESS,
    Cell,
    Guard,
    GuardedSet,
    Mutation,
    Store,
    declares,
    offered,
)

if TYPE_CHECKING:
    from percolator._internals import Internals
    from percolator._transaction import TransactionBase

log = logging.getLogger("percolator._commit")


class TwoPhaseCommit:
    """The two-phase commit of one transaction, phase by phase: :meth:`prewrite` (lock
    every cell, the primary first), :meth:`commit_point` (the primary's commit decides
    the transaction), :meth:`commit_secondaries` (clean-up that readers would otherwise
    roll forward), or :meth:`abort` (release what the prewrite locked).

    It works on the :class:`WriteSet` the transaction handed over (*ws*; :meth:`of` takes
    it from a transaction) and the cluster's parts it holds. ``cells`` holds one entry
    per written cell, the primary first (*cells*: those of :func:`cells_of`, where the
    caller made them). *crash* stops the commit at a :class:`CrashPoint`, as if its
    process died there (test harnesses). :func:`commit_transaction` runs the phases in
    order; a harness runs one of them alone (``bench/parallel_prewrite.py`` times
    :meth:`prewrite_guarded`)."""

    def __init__(self, ws: WriteSet, crash: CrashPoint | None,
                 cells: tuple[list[_Cell], bool] | None = None) -> None:
        self.write_set = ws
        self.cluster = ws.cluster
        self.parts = parts = ws.parts
        """The cluster's parts, looked up once when the transaction began."""
        self.store = parts.store
        self.crash = crash
        self.start_ts = ws.txn.start_ts
        self.cells, self.notifies = cells_of(ws) if cells is None else cells
        """The cells, and whether the commit makes notifications (weak ones, or of
        observed columns)."""
        self.primary = self.cells[0]
        self.owner = parts.coordination.current_owner()
        self.ttl_ms = int(self.cluster.lock_ttl * 1000)
        self.locked: list[_Cell] = []
        self.refreshed_at = time.monotonic()
        self.flight: _Flight | None = None
        """This commit as its client's readers follow it (:class:`CommitsInFlight`)."""

    @classmethod
    def of(cls, txn: TransactionBase, crash: CrashPoint | None = None) -> TwoPhaseCommit:
        """The two-phase commit of *txn*, which hands its writes over (and is closed
        from then on)."""
        return cls(txn._write_set(), crash)

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
        return _read_prewrite_state(self.store, [(self.start_ts, cells)])

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

    def prewrite_guarded(self, store: GuardedSet, cell: _Cell) -> bool:
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
                if not resolve_lock(self.parts, cell.table, cell.row, cell.column,
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
        """Lock the primary, then the secondaries (one batched read of all of them
        first, one per table), or, where the store can test the conflict conditions
        itself, one conditional mutation per cell, reading only a cell whose conditions
        held."""
        with self.parts.taking_locks():
            self._prewrite_all()

    def _prewrite_all(self) -> None:
        guarded = offered(self.store, SET_UNLESS)
        found: dict[int, tuple[bytes | None, list[Cell]]] = {}
        together = self._locked_together(guarded) if guarded is not None else set()
        if guarded is None:
            found = self._checked_before_locking()
        for index, cell in enumerate(self.cells):
            if index:
                self._refresh_primary()
            if id(cell) not in together and (
                    guarded is None or not self.prewrite_guarded(guarded, cell)):
                if id(cell) not in found:  # a guarded set refused: read this cell
                    found.update(self._read_for_prewrite([cell]))
                self._prewrite(cell, *found[id(cell)])
            self._maybe_crash("prewrite", index)

    def _checked_before_locking(self) -> dict[int, tuple[bytes | None, list[Cell]]]:
        """Each cell's lock and write records since start_ts, before the first lock is
        taken: as the transaction's own reads saw them where they read the cell
        (``WriteSet.read_state``), else from one read per table. A cell read before
        the primary is locked (here, or by the transaction after its start) is as good
        as one read after, since each lock is then set from the value read, which
        cannot have come back (no ABA) nor let a write record in without changing
        (invariant A); a store that may leave a FREE lock as it was has each cell's
        write records read again once it is locked (:attr:`recheck_after_lock`), and
        its reads are not taken.

        Then, still before the first lock, first committer wins for every cell, and a
        lock of another transaction on any cell is resolved or gives way (a commit of
        this client that committed after start_ts says so itself): a commit bound to
        fail takes no lock to give back (in a contended bank, a transfer whose second
        account changed since its start does not lock and free the first)."""
        seen = self.write_set.read_state
        found: dict[int, tuple[bytes | None, list[Cell]]] = {}
        if seen and not self.recheck_after_lock:
            for cell in self.cells:
                state = seen.get((cell.table, cell.row, cell.column))
                if state is not None:
                    found[id(cell)] = state
        unread = [c for c in self.cells if id(c) not in found]
        if unread:
            found.update(self._read_for_prewrite(unread))
        for cell in self.cells:
            self._check_writes(cell, found[id(cell)][1])
        for cell in self.cells:
            lock_raw = found[id(cell)][0]
            if lock_raw is not None and lock_raw[:1] != FREE_TAG:
                holder = decode_lock(lock_raw)
                if isinstance(holder, Lock) and (
                        ts := self.parts.in_flight.committed_after(holder, self.start_ts)):
                    # A commit of this client, which told it (CommitsInFlight).
                    raise self._conflict(cell, f"committed at {ts} after our start", ts)
                if not resolve_lock(self.parts, cell.table, cell.row, cell.column, lock_raw):
                    raise self._conflict(
                        cell, f"locked by live transaction {getattr(holder, 'start_ts', '?')}",
                        getattr(holder, "start_ts", None),
                    )
                found.update(self._read_for_prewrite([cell]))
                self._check_writes(cell, found[id(cell)][1])
        return found

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
                release(self.parts, cell.table, cell.row, cell.column, cell.held,
                        self.start_ts, None)
            except PercolatorError:
                log.warning("could not release lock of %d on %s/%r/%s; readers will clean it",
                            self.start_ts, cell.table, cell.row, cell.column)

    # --- commit -------------------------------------------------------------------------

    def commit_point(self, commit_ts: int) -> None:
        """Decide the transaction: the primary's lock becomes its write record at
        *commit_ts* (with the secondaries of its row, where the store writes a row
        atomically), after the owner's identity is confirmed.

        :raises ConflictError: a cleaner rolled the primary back first.
        :raises CoordinationError: the owner's session expired (nothing written).
        :raises CommitUnknownError: the store failed and the outcome cannot be told."""
        p = self.primary
        # Not under an identity whose session expired: others may treat its locks as
        # abandoned (raises CoordinationError; the caller releases the locks).
        self.parts.coordination.confirm_owner(self.owner)
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
                    assert self.write_set.settlement is not None
                    self.write_set.settlement.done = True
            else:
                decided = encode_lock(Committed(self.start_ts, commit_ts, delete, notify, p.inline))
                won = lock_cas(self.store, p.table, p.row, column, p.held, decided)
        except PercolatorError as e:
            won = self._committed_anyway(commit_ts, e)
        else:
            won = won or self._committed_anyway(commit_ts, None)
        if not won:
            raise self._conflict(p, "rolled back by a cleaner before the commit point", None)
        self.write_set.txn.commit_ts = commit_ts
        self.parts.stats["commits"] += 1
        self._maybe_crash("commit_point", 0)
        if not self.store.atomic_row_cas:
            try:
                release(self.parts, p.table, p.row, p.column, decided, self.start_ts,
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
        settlement = self.write_set.settlement  # see percolator._observer_hooks
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
        return committed_anyway(self.parts, self._lock_for(self.primary), commit_ts, error)

    def commit_secondaries(self, commit_ts: int) -> None:
        """After the commit point: write the other secondaries' records at *commit_ts*
        and free their locks (a failure here leaves locks that readers roll forward)."""
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
            release(self.parts, cell.table, cell.row, cell.column, cell.held,
                    self.start_ts,
                    (commit_ts, cell.value is None, cell.notify), recorded=recorded,
                    inline=cell.inline)
        self._maybe_crash("commit", len(secondaries))


def committed_anyway(
    parts: Internals, lock: Lock, commit_ts: int, error: PercolatorError | None
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
        status = check_txn_status(parts, lock)
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


def _finish_two_phase(committer: TwoPhaseCommit) -> int:
    in_flight = committer.parts.in_flight
    committer.flight = in_flight.begin(committer.start_ts)
    try:
        commit_ts = _commit_two_phase(committer)
    except SimulatedCrash:
        # A dead committer sweeps nothing, and tells its readers nothing more: its
        # locks are resolved through the store, as any dead client's.
        in_flight.end(committer.start_ts, forget=True)
        raise
    except BaseException:
        in_flight.end(committer.start_ts)
        committer.parts.sweep_locks()
        raise
    in_flight.end(committer.start_ts)
    committer.parts.sweep_locks()
    _wake(committer)
    return commit_ts


def _wake(committer: TwoPhaseCommit) -> None:
    if committer.notifies:
        committer.parts.wake_observers()


def _commit_timestamp(committer: TwoPhaseCommit) -> int:
    """The commit timestamp, drawn after the prewrite. An observer run that asked for
    its worker's next start timestamp (``_next_start``) gets it from the same draw,
    one above: a start timestamp drawn after this one is valid at any later time (a
    commit below it drew its timestamp earlier, after its own locks were written, so
    a read at it finds the lock or the commit), which is what the worker's next run
    needs; docs/timestamps.md, "A start timestamp drawn with the previous commit"."""
    timestamps = committer.parts.timestamps
    spare = committer.write_set.next_start
    if spare is None:
        return timestamps.get_timestamp()
    drawn = timestamps.get_timestamps(2)
    spare.fill(drawn[1])
    return drawn[0]


def _commit_two_phase(committer: TwoPhaseCommit) -> int:
    txn, ws = committer.write_set.txn, committer.write_set
    in_flight, flight = committer.parts.in_flight, committer.flight
    try:
        committer.prewrite()
        # After the prewrite, before the commit point: a transaction overtaken by the
        # GC safe point never commits (see percolator._safe_point).
        committer.parts.safe_point.check(txn.start_ts)
    except ConflictError:
        committer.parts.stats["conflicts"] += 1
        in_flight.tell(flight, committed=False)
        committer.abort()
        raise
    except SimulatedCrash:
        raise
    except BaseException:
        in_flight.tell(flight, committed=False)
        committer.abort()
        raise
    try:
        commit_ts = _commit_timestamp(committer)
        in_flight.tell(flight, commit_ts=commit_ts)
        # Weak notifications go before the commit point, so a committer that dies after
        # it cannot lose them (nothing else would write them); one that fails at the
        # commit point leaves a spurious one, which only runs an observer for nothing.
        # The index entries of strong ones go here too (a spurious entry is deleted by
        # the first worker that finds its cell settled).
        _write_notifications(ws, committer.cells, commit_ts)
    except BaseException:
        in_flight.tell(flight, committed=False)
        committer.abort()
        raise
    try:
        committer.commit_point(commit_ts)
    except ConflictError:
        committer.parts.stats["conflicts"] += 1
        in_flight.tell(flight, committed=False)
        committer.abort()
        raise
    except CoordinationError:  # raised before the commit point's write: nothing committed
        in_flight.tell(flight, committed=False)
        committer.abort()
        raise
    in_flight.tell(flight, committed=True)
    # Committed: what follows only cleans up; a failure leaves locks that readers
    # roll forward.
    try:
        committer.commit_secondaries(commit_ts)
    except SimulatedCrash:
        raise
    except PercolatorError as e:
        # A successful commit: a warning without a traceback (which read as a failure
        # on stderr); the traceback at DEBUG for whoever looks into the store.
        log.warning("transaction %d committed at %d; clean-up left to readers (%s: %s)",
                    txn.start_ts, commit_ts, type(e).__name__, e)
        log.debug("clean-up of transaction %d failed", txn.start_ts, exc_info=True)
    return commit_ts
